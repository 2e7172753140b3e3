package loadtest

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// FaultRow is one cell of the faults table: every run of one scenario on one
// backend with one guard (several with --repeat), summed.
type FaultRow struct {
	Fault, Backend, Guard string
	Gate                  string // "redis" for the gated runs
	Runs, Safe, Failed    int
	Fired                 int // runs whose fault did strike
	NotApplicable         bool
	Oversold, LostUpdates int
	Undersold             int
	// UndersoldSettled sums what the gate still withheld after its
	// back-check, over the runs that measured it (nil: none did).
	UndersoldSettled     *int
	LostAcks, Duplicates int
	Overlaps, Refused    int
	Recovery             []time.Duration // each run's, where measured
}

// Cells is the row as the tables print it.
func (f FaultRow) Cells() []string {
	if f.NotApplicable {
		return []string{f.Fault, f.Backend, f.guardCell(), "n/a", "-", "-", "-", "-", "-", "-", "-", "-"}
	}
	safe := "yes"
	switch {
	case f.Failed == f.Runs:
		safe = "FAILED"
	case f.Safe < f.Runs:
		safe = "NO"
	}
	if f.Runs > 1 {
		safe += fmt.Sprintf(" (%d/%d)", f.Safe, f.Runs)
	}
	rec := "-"
	switch n := len(f.Recovery); {
	case n == 1:
		rec = num(ms(f.Recovery[0]))
	case n > 1:
		rs := slices.Clone(f.Recovery)
		rec = fmt.Sprintf("%s (max %s)", num(ms(percentile(rs, 0.5))), num(ms(slices.Max(rs))))
	}
	fired := fmt.Sprintf("%d/%d", f.Fired, f.Runs)
	return []string{f.Fault, f.Backend, f.guardCell(), safe, fired, strconv.Itoa(f.Oversold), undersoldCell(f.Undersold, f.UndersoldSettled), strconv.Itoa(f.LostUpdates),
		strconv.Itoa(f.LostAcks + f.Duplicates), strconv.Itoa(f.Overlaps), strconv.Itoa(f.Refused), rec}
}

// guardCell is the guard as a run's name ends: +gate for a gated row.
func (f FaultRow) guardCell() string {
	if f.Gate != "" {
		return f.Guard + "+gate"
	}
	return f.Guard
}

// undersoldCell is undersold at the end of the load, and, where the gate's
// back-check was watched, what remained once it had run: "21 → 0".
func undersoldCell(undersold int, settled *int) string {
	if settled == nil {
		return strconv.Itoa(undersold)
	}
	return fmt.Sprintf("%d → %d", undersold, *settled)
}

// FaultHeads names FaultRow.Cells.
var FaultHeads = []string{"scenario", "backend", "guard", "safe?", "fired", "oversold", "undersold", "lost upd", "lost acks+dup", "overlaps", "refused", "recovery ms"}

// FaultRows groups the fault runs of results by scenario, backend and guard,
// in the order they first ran. Runs without a fault are left out.
func FaultRows(results []Result) []FaultRow {
	var rows []FaultRow
	index := map[string]int{}
	for _, r := range results {
		if r.Fault == "" {
			continue
		}
		k := r.Fault + "\x00" + r.Backend + "\x00" + r.Guard + "\x00" + r.Gate
		i, ok := index[k]
		if !ok {
			i = len(rows)
			index[k] = i
			rows = append(rows, FaultRow{Fault: r.Fault, Backend: r.Backend, Guard: r.Guard, Gate: r.Gate, NotApplicable: true})
		}
		row := &rows[i]
		if r.NotApplicable {
			continue
		}
		row.NotApplicable = false
		row.Runs++
		if r.Safe {
			row.Safe++
		}
		if r.Error != "" {
			row.Failed++
			continue
		}
		if !r.NotFired {
			row.Fired++
		}
		row.Oversold += r.Oversold
		row.Undersold += r.Undersold
		if r.UndersoldSettled != nil {
			sum := *r.UndersoldSettled
			if row.UndersoldSettled != nil {
				sum += *row.UndersoldSettled
			}
			row.UndersoldSettled = &sum
		}
		row.LostUpdates += r.LostUpdates
		row.LostAcks += r.LostAcks
		row.Duplicates += r.Duplicates
		row.Overlaps += r.Overlaps
		row.Refused += r.StaleWritesRefused
		if r.RecoveryMS != nil {
			row.Recovery = append(row.Recovery, time.Duration(*r.RecoveryMS*float64(time.Millisecond)))
		}
	}
	return rows
}

// Story says in plain words what happened in a fault run: what the fault
// did, whether two holders overlapped, what the guard refused, and what
// the invariants found.
func (r Result) Story() string {
	switch {
	case r.NotApplicable:
		return fmt.Sprintf("%s does not apply to backend %s", r.Fault, r.Backend)
	case r.Error != "":
		return "could not run: " + firstLine(r.Error)
	}
	var parts []string
	if r.NotFired {
		parts = append(parts, "FAULT DID NOT FIRE (the run says nothing about "+r.Fault+")")
	}
	if len(r.FaultEvents) > 0 {
		parts = append(parts, strings.Join(r.FaultEvents, "; "))
	}
	switch r.Overlaps {
	case 0:
		parts = append(parts, "no two holders overlapped")
	case 1:
		parts = append(parts, "two holders overlapped once")
	default:
		parts = append(parts, fmt.Sprintf("two holders overlapped %d times", r.Overlaps))
	}
	if r.StaleWritesRefused > 0 {
		parts = append(parts, fmt.Sprintf("guard %s refused %d stale %s", r.Guard, r.StaleWritesRefused, plural(r.StaleWritesRefused, "write", "writes")))
	} else if r.Guard == "none" {
		parts = append(parts, "guard none refuses nothing")
	} else {
		parts = append(parts, fmt.Sprintf("guard %s refused no write", r.Guard))
	}
	if r.RecoveryMS != nil {
		parts = append(parts, fmt.Sprintf("orders resumed after %s ms", num(*r.RecoveryMS)))
	}
	if v := r.Verdict(); v == "safe" {
		parts = append(parts, "no oversell, no lost update, nothing acknowledged lost")
	} else {
		parts = append(parts, v)
	}
	return strings.Join(parts, "; ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// faultDefinitions says what the faults table's columns mean.
const faultDefinitions = `*safe?* = every invariant held in every run of the cell (n/a: the scenario, or guard fencing on a backend without a token, does not apply). *fired* = runs in which the fault did strike, of the cell's runs. *undersold* = stock left at the end on SKUs that refused an order out_of_stock, summed over the cell's runs. *overlaps* = pairs of leases on one key that two replicas held at once, from the replicas' own lease records (acquired, released or lost), one clock. *refused* = stale writes the MySQL guard refused (version conflicts and stale fences). *recovery* = the time from the fault to the next order decided on the disrupted SKU: the median over the cell's runs, and the longest.`

// writeFaultsMarkdown writes the faults table and one line per fault run.
func writeFaultsMarkdown(w io.Writer, results []Result) {
	rows := FaultRows(results)
	if len(rows) == 0 {
		return
	}
	rule := make([]string, len(FaultHeads))
	for i := range rule {
		rule[i] = "---"
	}
	fmt.Fprintf(w, "\n## Faults\n\n| %s |\n|%s|\n", strings.Join(FaultHeads, " | "), strings.Join(rule, "|"))
	for _, row := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(row.Cells(), " | "))
	}
	fmt.Fprintf(w, "\n%s\n\n", faultDefinitions)
	for _, r := range results {
		if r.Fault == "" {
			continue
		}
		fmt.Fprintf(w, "**%s** (seed %d)\n\n", r.Name(), r.Seed)
		for _, l := range r.StoryLines() {
			if l.At != "" {
				fmt.Fprintf(w, "- %s %s\n", l.At, l.Text)
			} else {
				fmt.Fprintf(w, "- %s\n", l.Text)
			}
		}
		fmt.Fprintln(w)
	}
}

// WriteFaultTable writes the faults table as aligned text; nothing when no
// run had a fault.
func WriteFaultTable(w io.Writer, results []Result) error {
	rows := FaultRows(results)
	if len(rows) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(FaultHeads, "\t"))
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row.Cells(), "\t"))
	}
	return tw.Flush()
}
