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
// next to two figures measured in the same run at the same counts: the
// lock-free reference (the cheapest safe order) and the HTTP ceiling (the
// most the balancer and replicas answer at all).

// The reference of a sweep: no lock, and the atomic guard's conditional
// decrement, the cheapest safe order there is.
const (
	ReferenceBackend = "none"
	ReferenceGuard   = "atomic"
	referenceName    = ReferenceBackend + "/" + ReferenceGuard
)

// The ceiling run: GET /healthz unpaced through the same balancer and
// replicas, no stock and no MySQL; its answers per second
// (throughput_rps) are the limit every strategy is compared to.
const (
	WorkloadCeiling = "ceiling" // Spec.Workload and Result.Workload
	CeilingName     = "ceiling" // its Result.Name
	CeilingPath     = "/healthz"
)

// SweepMD is the sweep's table in the report folder.
const SweepMD = "sweep.md"

// IsReference reports whether r is a run of the reference.
func (r Result) IsReference() bool {
	return r.Backend == ReferenceBackend && r.Guard == ReferenceGuard && r.Fault == "" && r.Gate == "" && r.Accept == "" && r.Workload == ""
}

// IsCeiling reports whether r is a ceiling run.
func (r Result) IsCeiling() bool { return r.Workload == WorkloadCeiling }

// ceilingPath is the path a run GETs instead of ordering: the ceiling's.
func ceilingPath(s Spec) string {
	if s.Workload == WorkloadCeiling {
		return CeilingPath
	}
	return ""
}

// sweepRate is what the sweep compares of a run: orders (201s) per second;
// for a queue run, which answers 202 and writes later, orders accepted
// (202s) per second, what its customers are answered at (how fast MySQL
// takes their outcomes is SettledRPS, shown beside); for the ceiling,
// which orders nothing, answers per second.
func (r Result) sweepRate() float64 {
	switch {
	case r.IsCeiling():
		return r.ThroughputRPS
	case r.Accept == "queue":
		return r.AcceptedRPS
	}
	return r.OrdersRPS
}

// Cell is one point of a sweep: how many replicas, how many hot SKUs.
type Cell struct {
	Replicas int
	SKUs     int
}

func (c Cell) String() string { return fmt.Sprintf("%d×%d", c.Replicas, c.SKUs) }

// Point is one configuration (a run name: backend/guard) in one cell,
// over its runs there: the reference runs twice per cell, and --repeat runs
// everything more than once.
type Point struct {
	Runs      int     // runs of it in the cell
	Ran       int     // of which ran (no Error)
	OrdersRPS float64 // mean orders (201s) per second over the runs that ran; the ceiling's answers
	Min, Max  float64 // the lowest and highest orders/s of those runs
	P99       float64 // mean client p99 in ms over the same runs
	// Ratio is OrdersRPS over the cell's reference OrdersRPS; valid only
	// when HasRatio (both ran, and the reference sold something).
	Ratio    float64
	HasRatio bool
	// CeilingRatio is OrdersRPS over the cell's ceiling (its answers per
	// second); valid only when HasCeiling.
	CeilingRatio float64
	HasCeiling   bool
	Unsafe       bool // a run broke an invariant: its figures are not a safe lock's
	// Queue: the runs answered 202 (accept queue): OrdersRPS is their
	// 202s per second, SettledRPS the mean of their outcomes per second.
	Queue      bool
	SettledRPS float64
}

// Sweep is a sweep's results arranged as a table: one row per run name,
// one column per cell.
type Sweep struct {
	Cells  []Cell   // sorted by replicas, then SKUs
	Names  []string // the ceiling, the reference, then in the order the runs came
	Points map[string]map[Cell]Point
}

// NewSweep arranges results (of any lab, sweep or not) by name and cell,
// and computes each point's ratios to the reference and the ceiling of its
// cell. Fault runs
// are left out: the sweep measures cost, not safety under faults.
func NewSweep(results []Result) Sweep {
	s := Sweep{Points: map[string]map[Cell]Point{}}
	type sums struct{ rps, p99, settled float64 }
	acc := map[string]map[Cell]sums{}
	for _, r := range results {
		if r.Fault != "" || r.Workload == WorkloadReservations {
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
			rps := r.sweepRate()
			if p.Ran == 0 || rps < p.Min {
				p.Min = rps
			}
			p.Max = max(p.Max, rps)
			p.Ran++
			a.rps += rps
			a.p99 += r.LatencyMS.P99
			a.settled += r.SettledRPS
			p.Unsafe = p.Unsafe || !r.Safe
			p.Queue = p.Queue || r.Accept == "queue"
		}
		s.Points[name][c], acc[name][c] = p, a
	}
	for name, cells := range s.Points {
		for c, p := range cells {
			if p.Ran > 0 {
				a := acc[name][c]
				p.OrdersRPS, p.P99 = round(a.rps/float64(p.Ran)), round(a.p99/float64(p.Ran))
				p.SettledRPS = round(a.settled / float64(p.Ran))
			}
			cells[c] = p
		}
	}
	for name, cells := range s.Points {
		for c, p := range cells {
			if ref, ok := s.Points[referenceName][c]; ok && ref.Ran > 0 && ref.OrdersRPS > 0 && p.Ran > 0 && name != CeilingName {
				p.Ratio, p.HasRatio = round(p.OrdersRPS/ref.OrdersRPS), true
			}
			if top, ok := s.Points[CeilingName][c]; ok && top.Ran > 0 && top.OrdersRPS > 0 && p.Ran > 0 && name != CeilingName {
				p.CeilingRatio, p.HasCeiling = round(p.OrdersRPS/top.OrdersRPS), true
			}
			cells[c] = p
		}
	}
	slices.SortFunc(s.Cells, func(a, b Cell) int {
		return cmp.Or(cmp.Compare(a.Replicas, b.Replicas), cmp.Compare(a.SKUs, b.SKUs))
	})
	for _, first := range []string{referenceName, CeilingName} {
		if i := slices.Index(s.Names, first); i > 0 {
			s.Names = slices.Insert(slices.Delete(s.Names, i, i+1), 0, first)
		}
	}
	return s
}

// Point returns name's point in c, if it ran there at all.
func (s Sweep) Point(name string, c Cell) (Point, bool) {
	p, ok := s.Points[name][c]
	return p, ok
}

// throughputCell is "812", "412 (0.51; ceiling 0.30)", "FAILED", "-", with
// "!" after a point that broke an invariant: the ratios to the reference
// and to the ceiling. A point of several runs adds their range,
// "812 [790–834]", which shows how much the machine drifted in the cell.
// A queue point's figure is its 202s, and its outcomes per second follow:
// "2400 accepted (4.10; ceiling 0.62), settled 2300/s".
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
	if p.Queue {
		out += " accepted"
	}
	var ratios []string
	if p.HasRatio && name != referenceName {
		ratios = append(ratios, fmt.Sprintf("%.2f", p.Ratio))
	}
	if p.HasCeiling {
		ratios = append(ratios, fmt.Sprintf("ceiling %.2f", p.CeilingRatio))
	}
	if len(ratios) > 0 {
		out += " (" + strings.Join(ratios, "; ") + ")"
	}
	if p.Queue {
		out += fmt.Sprintf(", settled %.0f/s", p.SettledRPS)
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
		switch name {
		case referenceName:
			row[0] += " (reference)"
		case CeilingName:
			row[0] += " (GET " + CeilingPath + ", answers/s)"
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

// The queue's goals in the hot cell: its 202s per second at least
// QueueGoalRatio times the reference's 201s, and at least
// QueueCeilingGoal of the ceiling.
const (
	QueueGoalRatio   = 5.0
	QueueCeilingGoal = 0.5
)

// CoalescingGoal: every shared lock (not none, not local), coalescing the
// orders that queue for it, at least this ratio to the reference in the
// hot cell.
const CoalescingGoal = 2.0

// writeGoal says, for the hot cell, each backend's ratio to the reference
// and to the ceiling, whether redis meets GoalRatio, and which shared
// locks meet CoalescingGoal.
func (s Sweep) writeGoal(w io.Writer) {
	_, ref := s.Point(referenceName, HotCell)
	_, top := s.Point(CeilingName, HotCell)
	if !ref && !top {
		return
	}
	var toRef, toTop []string
	for _, name := range s.Names {
		p, _ := s.Point(name, HotCell)
		if p.HasRatio && name != referenceName {
			toRef = append(toRef, fmt.Sprintf(" %s %.2f;", name, p.Ratio))
		}
		if p.HasCeiling {
			toTop = append(toTop, fmt.Sprintf(" %s %.2f;", name, p.CeilingRatio))
		}
	}
	for _, line := range []struct {
		to    string
		parts []string
	}{{referenceName, toRef}, {"the ceiling", toTop}} {
		if len(line.parts) > 0 {
			fmt.Fprintf(w, "Hot SKU, %d replicas (%s), ratio to %s:%s\n", HotCell.Replicas, HotCell, line.to, strings.Join(line.parts, ""))
		}
	}
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
		fmt.Fprintf(w, "Goal %s >= %.2f of %s: %.2f, %s.\n", name, GoalRatio, referenceName, p.Ratio, verdict)
	}
	for _, name := range s.Names {
		p, ok := s.Point(name, HotCell)
		if !ok || !p.Queue {
			continue
		}
		goal := func(got float64, has bool, want float64) string {
			switch {
			case !has:
				return "not measured"
			case got < want:
				return fmt.Sprintf("%.2f, missed by %.2f", got, want-got)
			}
			return fmt.Sprintf("%.2f, met", got)
		}
		fmt.Fprintf(w, "Goal %s accepted >= %.0fx %s's orders: %s; >= %.1fx the ceiling: %s (settled %.0f/s).\n",
			name, QueueGoalRatio, referenceName, goal(p.Ratio, p.HasRatio, QueueGoalRatio),
			QueueCeilingGoal, goal(p.CeilingRatio, p.HasCeiling, QueueCeilingGoal), p.SettledRPS)
	}
	var locks []string
	for _, name := range s.Names {
		p, ok := s.Point(name, HotCell)
		if backend, _, _ := strings.Cut(name, "/"); !ok || name == CeilingName || backend == ReferenceBackend || backend == "local" || strings.Contains(name, "+") {
			continue
		}
		switch {
		case !p.HasRatio:
			locks = append(locks, name+" not measured")
		case p.Ratio >= CoalescingGoal:
			locks = append(locks, fmt.Sprintf("%s %.2f, met", name, p.Ratio))
		default:
			locks = append(locks, fmt.Sprintf("%s %.2f, missed by %.2f", name, p.Ratio, CoalescingGoal-p.Ratio))
		}
	}
	if len(locks) > 0 {
		fmt.Fprintf(w, "Goal every shared lock >= %.2f of %s (coalescing): %s.\n", CoalescingGoal, referenceName, strings.Join(locks, "; "))
	}
}

// WriteSweepTables writes the throughput and p99 tables and the goal, in
// Markdown: what the lab prints on stderr after a sweep.
func WriteSweepTables(w io.Writer, results []Result) {
	s := NewSweep(results)
	fmt.Fprintf(w, "Orders per second (201s only; a +queue run's 202s, then its outcomes per second; the ceiling's answers), and in brackets the ratio to %s and to the ceiling in the same cell:\n\n", referenceName)
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
			"The reference runs first and last in every round of a cell (the ceiling just after its first run); its figure is the mean of its runs there, their range in square brackets: how far the machine drifted during the cell. "+
			"A configuration run more than once (--repeat) shows its mean and range the same way.\n\n",
			r.Requests, r.Workers, rate, r.InitialStock, r.WorkDelay, r.LockTTL)
	}
	fmt.Fprintf(w, "%s\n\n", sweepDefinitions)
	WriteSweepTables(w, rep.Results)

	fmt.Fprintf(w, "\n## Every run\n\n")
	fmt.Fprintf(w, "| # | run | replicas | SKUs | orders/s | ratio | ceiling ratio | p50 ms | p99 ms | answers | peak RSS MiB | verdict |\n|%s\n", strings.Repeat("---|", 12))
	s := NewSweep(rep.Results)
	for i, r := range rep.Results {
		ratio := func(to string) string {
			if top, ok := s.Point(to, Cell{r.Replicas, r.SKUs}); ok && top.OrdersRPS > 0 && r.Error == "" && !r.IsCeiling() {
				return fmt.Sprintf("%.2f", r.sweepRate()/top.OrdersRPS)
			}
			return "-"
		}
		rss := "-"
		if r.PeakRSSMB > 0 {
			rss = num(r.PeakRSSMB)
		}
		figures := []string{fmt.Sprintf("%.0f", r.sweepRate()), ratio(referenceName), ratio(CeilingName), num(r.LatencyMS.P50), num(r.LatencyMS.P99), statusLine(r), rss}
		if r.Error != "" {
			figures = []string{"-", "-", "-", "-", "-", "-", "-"}
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
// capped the reference or the ceiling would flatter every ratio.
const SweepRate = 100000

const sweepDefinitions = `How to read it: *orders/s* = orders answered 201 per second, from the first request sent to the last answer; the stock per SKU covers every request, so no run sells out and every answer is an order unless something failed. ` +
	`A *+queue* run answers 202 once the gate took the stock and the order is on the stream, and writes MySQL later: its figure is orders *accepted* (202s) per second over the same span, what its customers are answered at, with its ratios; *settled* beside it is the outcomes MySQL took (confirmed or rejected) per second, from the first request sent to the last outcome: below the accepted rate when the consumers fell behind. ` +
	`The *ratio* is a configuration's orders/s over the reference's (lock none, guard atomic: one conditional UPDATE, no lock) in the same cell: what the lock costs end to end, all else equal. ` +
	`The *ceiling* is GET /healthz unpaced through the same balancer and replicas (no stock, no MySQL, no lock): its answers per second are the most this box serves over HTTP at all, and a configuration's *ceiling ratio* is its orders/s over them. ` +
	`Lock runs use guard none unless --guards says otherwise, so the figure is the lock's own cost, with no guard's retries in it; with no work delay the critical section is only the flow's own round trips (cache read, transaction, cache write), so the ratio is a pure cost comparison and would rise towards 1 as business logic inside the lock grew. ` +
	`p99 is client-side over every answer (nearest rank); with every worker queued on one hot SKU it mostly measures the queue. ` +
	`Each run is also bounded in time (four times its nominal length at the offered rate plus the request timeout, so about 15 s unpaced): one cut off says so in its notes, and its orders/s covers what it served. ` +
	`Machine noise: replicas, servers and the load generator share the same cores, so compare within a cell, not across sweeps.`
