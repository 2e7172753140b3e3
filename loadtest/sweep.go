package loadtest

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The lab's --sweep measures what each lock costs end to end: orders per
// second and p99 for every backend at several replica and SKU counts, each
// next to the lock-free ceiling measured in the same run at the same counts.

// The ceiling of a sweep: no lock, and the atomic guard's conditional
// decrement, the cheapest safe order there is.
const (
	CeilingBackend = "none"
	CeilingGuard   = "atomic"
)

// SweepMD is the sweep's table in the report folder.
const SweepMD = "sweep.md"

// IsCeiling reports whether r is a run of the ceiling.
func (r Result) IsCeiling() bool {
	return r.Backend == CeilingBackend && r.Guard == CeilingGuard && r.Fault == "" && r.Gate == ""
}

// Cell is one point of a sweep: how many replicas, how many hot SKUs.
type Cell struct {
	Replicas int
	SKUs     int
}

func (c Cell) String() string { return fmt.Sprintf("%d×%d", c.Replicas, c.SKUs) }

// Point is one configuration (a run name: backend/guard) in one cell,
// over its runs there: the ceiling runs twice per cell, and --repeat runs
// everything more than once.
type Point struct {
	Runs      int     // runs of it in the cell
	Ran       int     // of which ran (no Error)
	OrdersRPS float64 // mean orders (201s) per second over the runs that ran
	Min, Max  float64 // the lowest and highest orders/s of those runs
	P99       float64 // mean client p99 in ms over the same runs
	// Ratio is OrdersRPS over the cell's ceiling OrdersRPS; valid only
	// when HasRatio (both ran, and the ceiling sold something).
	Ratio    float64
	HasRatio bool
	Unsafe   bool // a run broke an invariant: its figures are not a safe lock's
}

// Sweep is a sweep's results arranged as a table: one row per run name,
// one column per cell.
type Sweep struct {
	Cells  []Cell   // sorted by replicas, then SKUs
	Names  []string // the ceiling first, then in the order the runs came
	Points map[string]map[Cell]Point
}

// NewSweep arranges results (of any lab, sweep or not) by name and cell,
// and computes each point's ratio to the ceiling of its cell. Fault runs
// are left out: the sweep measures cost, not safety under faults.
func NewSweep(results []Result) Sweep {
	s := Sweep{Points: map[string]map[Cell]Point{}}
	type sums struct{ rps, p99 float64 }
	acc := map[string]map[Cell]sums{}
	for _, r := range results {
		if r.Fault != "" {
			continue
		}
		name, c := r.Name(), Cell{r.Replicas, r.SKUs}
		if !slices.Contains(s.Cells, c) {
			s.Cells = append(s.Cells, c)
		}
		if s.Points[name] == nil {
			s.Names = append(s.Names, name)
			s.Points[name] = map[Cell]Point{}
			acc[name] = map[Cell]sums{}
		}
		p, a := s.Points[name][c], acc[name][c]
		p.Runs++
		if r.Error == "" {
			if p.Ran == 0 || r.OrdersRPS < p.Min {
				p.Min = r.OrdersRPS
			}
			p.Max = max(p.Max, r.OrdersRPS)
			p.Ran++
			a.rps += r.OrdersRPS
			a.p99 += r.LatencyMS.P99
			p.Unsafe = p.Unsafe || !r.Safe
		}
		s.Points[name][c], acc[name][c] = p, a
	}
	for name, cells := range s.Points {
		for c, p := range cells {
			if p.Ran > 0 {
				a := acc[name][c]
				p.OrdersRPS, p.P99 = round(a.rps/float64(p.Ran)), round(a.p99/float64(p.Ran))
			}
			cells[c] = p
		}
	}
	ceiling := CeilingBackend + "/" + CeilingGuard
	for _, cells := range s.Points {
		for c, p := range cells {
			top, ok := s.Points[ceiling][c]
			if ok && top.Ran > 0 && top.OrdersRPS > 0 && p.Ran > 0 {
				p.Ratio, p.HasRatio = round(p.OrdersRPS/top.OrdersRPS), true
			}
			cells[c] = p
		}
	}
	slices.SortFunc(s.Cells, func(a, b Cell) int {
		return cmp.Or(cmp.Compare(a.Replicas, b.Replicas), cmp.Compare(a.SKUs, b.SKUs))
	})
	if i := slices.Index(s.Names, ceiling); i > 0 {
		s.Names = slices.Insert(slices.Delete(s.Names, i, i+1), 0, ceiling)
	}
	return s
}

// Point returns name's point in c, if it ran there at all.
func (s Sweep) Point(name string, c Cell) (Point, bool) {
	p, ok := s.Points[name][c]
	return p, ok
}

// throughputCell is "812", "412 (0.51)", "FAILED", "-", with "!" after a
// point that broke an invariant; a point of several runs adds their range,
// "812 [790–834]", which shows how much the machine drifted in the cell.
func (s Sweep) throughputCell(name string, c Cell) string {
	p, ok := s.Point(name, c)
	switch {
	case !ok:
		return "-"
	case p.Ran == 0:
		return "FAILED"
	}
	out := fmt.Sprintf("%.0f", p.OrdersRPS)
	if p.Ran > 1 {
		out += fmt.Sprintf(" [%.0f–%.0f]", p.Min, p.Max)
	}
	if p.HasRatio && name != CeilingBackend+"/"+CeilingGuard {
		out += fmt.Sprintf(" (%.2f)", p.Ratio)
	}
	if p.Unsafe {
		out += " !"
	}
	return out
}

func (s Sweep) p99Cell(name string, c Cell) string {
	p, ok := s.Point(name, c)
	switch {
	case !ok:
		return "-"
	case p.Ran == 0:
		return "FAILED"
	}
	return num(p.P99)
}

// writeMatrix writes one Markdown table: a row per name, a column per cell.
func (s Sweep) writeMatrix(w io.Writer, cell func(name string, c Cell) string) {
	heads := []string{"run \\ replicas×SKUs"}
	for _, c := range s.Cells {
		heads = append(heads, c.String())
	}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(heads, " | "), strings.Repeat("---|", len(heads)))
	for _, name := range s.Names {
		row := []string{name}
		if name == CeilingBackend+"/"+CeilingGuard {
			row[0] += " (ceiling)"
		}
		for _, c := range s.Cells {
			row = append(row, cell(name, c))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
}

// HotCell is where the end-to-end goal is set: one hot SKU, three
// replicas; GoalRatio is the redis backend's goal there.
var HotCell = Cell{Replicas: 3, SKUs: 1}

// GoalRatio: a locked hot SKU at least as fast as the lock-free reference,
// which coalescing orders under one lease makes reachable.
const GoalRatio = 1.0

// writeGoal says, for the hot cell, each backend's ratio to the ceiling and
// whether redis meets GoalRatio.
func (s Sweep) writeGoal(w io.Writer) {
	if _, ok := s.Point(CeilingBackend+"/"+CeilingGuard, HotCell); !ok {
		return
	}
	fmt.Fprintf(w, "Hot SKU, %d replicas (%s), ratio to the ceiling:", HotCell.Replicas, HotCell)
	for _, name := range s.Names[1:] {
		if p, ok := s.Point(name, HotCell); ok && p.HasRatio {
			fmt.Fprintf(w, " %s %.2f;", name, p.Ratio)
		}
	}
	fmt.Fprintln(w)
	for _, name := range s.Names {
		if backend, _, _ := strings.Cut(name, "/"); backend != "redis" {
			continue
		}
		p, ok := s.Point(name, HotCell)
		if !ok || !p.HasRatio {
			fmt.Fprintf(w, "Goal %s >= %.2f: not measured.\n", name, GoalRatio)
			continue
		}
		verdict := "met"
		if p.Ratio < GoalRatio {
			verdict = fmt.Sprintf("missed by %.2f", GoalRatio-p.Ratio)
		}
		fmt.Fprintf(w, "Goal %s >= %.2f of the ceiling: %.2f, %s.\n", name, GoalRatio, p.Ratio, verdict)
	}
}

// WriteSweepTables writes the throughput and p99 tables and the goal, in
// Markdown: what the lab prints on stderr after a sweep.
func WriteSweepTables(w io.Writer, results []Result) {
	s := NewSweep(results)
	fmt.Fprintf(w, "Orders per second (201s only), and in brackets the ratio to %s/%s in the same cell:\n\n", CeilingBackend, CeilingGuard)
	s.writeMatrix(w, s.throughputCell)
	fmt.Fprintf(w, "\nClient p99 latency, ms:\n\n")
	s.writeMatrix(w, s.p99Cell)
	fmt.Fprintln(w)
	if slices.ContainsFunc(results, func(r Result) bool { return r.Fault == "" && r.Error == "" && !r.Safe }) {
		fmt.Fprintln(w, "! = a run that broke an invariant (lost updates): that lock alone does not hold across replicas, so its figure is not a safe lock's.")
	}
	s.writeGoal(w)
}

// WriteSweep writes sweep.md: how the sweep was run, its tables, and every
// run on a line of its own.
func WriteSweep(w io.Writer, rep Report) {
	fmt.Fprintf(w, "# oversold lab sweep\n\n")
	fmt.Fprintf(w, "`%s`, %s, %s wall time, %d runs.\n\n", rep.Command, rep.Started.Format("2006-01-02 15:04 MST"), rep.Wall.Round(100e6), len(rep.Results))
	fmt.Fprintf(w, "Machine: %s.\n\n", rep.Machine)
	if len(rep.Results) > 0 {
		r := rep.Results[0]
		rate := fmt.Sprintf("%d/s offered", r.Rate)
		if r.Rate >= SweepRate {
			rate = fmt.Sprintf("%d/s offered, that is unpaced: as fast as the workers allow", r.Rate)
		}
		fmt.Fprintf(w, "Each run: fresh replicas behind the round-robin balancer, %d orders of quantity 1 spread round-robin over its SKUs, "+
			"%d in flight at most, %s, %d stock per SKU, work delay %s, lock TTL %s. "+
			"The ceiling runs first and last in every round of a cell; its figure is the mean of its runs there, their range in square brackets: how far the machine drifted during the cell. "+
			"A configuration run more than once (--repeat) shows its mean and range the same way.\n\n",
			r.Requests, r.Workers, rate, r.InitialStock, r.WorkDelay, r.LockTTL)
	}
	fmt.Fprintf(w, "%s\n\n", sweepDefinitions)
	WriteSweepTables(w, rep.Results)

	fmt.Fprintf(w, "\n## Every run\n\n")
	fmt.Fprintf(w, "| # | run | replicas | SKUs | orders/s | ratio | p50 ms | p99 ms | answers | peak RSS MiB | verdict |\n|%s\n", strings.Repeat("---|", 11))
	s := NewSweep(rep.Results)
	ceiling := CeilingBackend + "/" + CeilingGuard
	for i, r := range rep.Results {
		ratio := "-"
		if top, ok := s.Point(ceiling, Cell{r.Replicas, r.SKUs}); ok && top.OrdersRPS > 0 && r.Error == "" {
			ratio = fmt.Sprintf("%.2f", r.OrdersRPS/top.OrdersRPS)
		}
		rss := "-"
		if r.PeakRSSMB > 0 {
			rss = num(r.PeakRSSMB)
		}
		figures := []string{fmt.Sprintf("%.0f", r.OrdersRPS), ratio, num(r.LatencyMS.P50), num(r.LatencyMS.P99), statusLine(r), rss}
		if r.Error != "" {
			figures = []string{"-", "-", "-", "-", "-", "-"}
		}
		row := append([]string{fmt.Sprint(i + 1), r.Name(), fmt.Sprint(r.Replicas), fmt.Sprint(r.SKUs)}, figures...)
		row = append(row, strings.ReplaceAll(r.Verdict(), "|", `\|`))
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	for i, r := range rep.Results {
		if len(r.Notes) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n**#%d %s, %s**\n\n", i+1, r.Name(), Cell{r.Replicas, r.SKUs})
		for _, n := range r.Notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
	}
}

// WriteSweepFile writes sweep.md into dir.
func WriteSweepFile(dir string, rep Report) error {
	var b strings.Builder
	WriteSweep(&b, rep)
	if err := os.WriteFile(filepath.Join(dir, SweepMD), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	return nil
}

// SweepRate is the rate a sweep offers unless told otherwise: far above
// what any configuration serves on one machine, so the pacer never waits
// and the workers (requests in flight) are the only limit. A rate that
// capped the ceiling would flatter every ratio.
const SweepRate = 100000

const sweepDefinitions = `How to read it: *orders/s* = orders answered 201 per second, from the first request sent to the last answer; the stock per SKU covers every request, so no run sells out and every answer is an order unless something failed. ` +
	`The *ratio* is a configuration's orders/s over the ceiling's (lock none, guard atomic: one conditional UPDATE, no lock) in the same cell: what the lock costs end to end, all else equal. ` +
	`Lock runs use guard none unless --guards says otherwise, so the figure is the lock's own cost, with no guard's retries in it; with no work delay the critical section is only the flow's own round trips (cache read, transaction, cache write), so the ratio is a pure cost comparison and would rise towards 1 as business logic inside the lock grew. ` +
	`p99 is client-side over every answer (nearest rank); with every worker queued on one hot SKU it mostly measures the queue. ` +
	`Each run is also bounded in time (four times its nominal length at the offered rate plus the request timeout, so about 15 s unpaced): one cut off says so in its notes, and its orders/s covers what it served. ` +
	`Machine noise: replicas, servers and the load generator share the same cores, so compare within a cell, not across sweeps.`
