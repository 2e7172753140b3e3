package loadtest

import (
	"strings"
	"testing"
	"time"
)

// sweepRun is a crafted run: name, cell, orders/s, p99.
func sweepRun(backend, guard string, replicas, skus int, rps, p99 float64) Result {
	return Result{
		Backend: backend, Guard: guard, Replicas: replicas, SKUs: skus,
		OrdersRPS: rps, LatencyMS: Latency{P99: p99}, Safe: true,
		Requests: 400, Workers: 64, Rate: SweepRate, InitialStock: 400, WorkDelay: "0s", LockTTL: "2s",
		Status: map[string]int{"201": 400},
	}
}

// ceilingRun is a crafted ceiling run: GET /healthz, answers per second.
func ceilingRun(replicas, skus int, answers float64) Result {
	return Result{
		Backend: "none", Guard: "none", Workload: WorkloadCeiling, Replicas: replicas, SKUs: skus,
		ThroughputRPS: answers, LatencyMS: Latency{P99: 20}, Safe: true,
		Requests: 400, Workers: 64, Rate: SweepRate, WorkDelay: "0s", LockTTL: "2s",
		Status: map[string]int{"200": 400},
	}
}

func craftedSweep() []Result {
	failed := sweepRun("etcd", "none", 3, 1, 0, 0)
	failed.Error, failed.Safe = "etcd server: not installed", false
	unsafe := sweepRun("local", "none", 3, 1, 1200, 90)
	unsafe.LostUpdates, unsafe.Safe = 37, false
	fault := sweepRun("redis", "none", 3, 1, 10, 5000)
	fault.Fault = "pause-holder"
	return []Result{
		// Cell 3×1, the hot cell: the reference straddles the others.
		sweepRun("none", "atomic", 3, 1, 800, 100),
		ceilingRun(3, 1, 3000),
		sweepRun("redis", "none", 3, 1, 450, 300),
		unsafe,
		failed,
		fault,
		sweepRun("none", "atomic", 3, 1, 1000, 140),
		// Cell 1×4, listed after but sorted before; its reference comes last.
		sweepRun("redis", "none", 1, 4, 300, 200),
		ceilingRun(1, 4, 1500),
		sweepRun("none", "atomic", 1, 4, 600, 80),
		// A redis run whose reference failed, and no ceiling: no ratio.
		func() Result { r := sweepRun("none", "atomic", 2, 16, 0, 0); r.Error = "boom"; return r }(),
		sweepRun("redis", "none", 2, 16, 700, 50),
	}
}

// TestSweepMath: the reference of a cell is the mean of its runs there,
// each point's ratios are against its own cell's reference and ceiling (the
// ceiling's answers, not its orders, of which it has none), and failed,
// unsafe and fault runs are told apart.
func TestSweepMath(t *testing.T) {
	s := NewSweep(craftedSweep())
	wantCells := []Cell{{1, 4}, {2, 16}, {3, 1}}
	if len(s.Cells) != len(wantCells) {
		t.Fatalf("cells %v, want %v", s.Cells, wantCells)
	}
	for i, c := range wantCells {
		if s.Cells[i] != c {
			t.Fatalf("cells %v, want %v", s.Cells, wantCells)
		}
	}
	if want := []string{"ceiling", "none/atomic", "redis/none", "local/none", "etcd/none"}; strings.Join(s.Names, ",") != strings.Join(want, ",") {
		t.Errorf("names %v, want %v (ceiling and reference first, fault runs left out)", s.Names, want)
	}

	type check struct {
		name     string
		cell     Cell
		rps, p99 float64
		ratio    float64
		hasRatio bool
		top      float64 // ratio to the ceiling
		hasTop   bool
		ran      int
		unsafe   bool
	}
	for _, c := range []check{
		{"ceiling", Cell{3, 1}, 3000, 20, 0, false, 0, false, 1, false},
		{"none/atomic", Cell{3, 1}, 900, 120, 1, true, 0.3, true, 2, false}, // mean of 800 and 1000
		{"redis/none", Cell{3, 1}, 450, 300, 0.5, true, 0.15, true, 1, false},
		{"local/none", Cell{3, 1}, 1200, 90, 1.33, true, 0.4, true, 1, true},
		{"etcd/none", Cell{3, 1}, 0, 0, 0, false, 0, false, 0, false},
		{"redis/none", Cell{1, 4}, 300, 200, 0.5, true, 0.2, true, 1, false},
		{"redis/none", Cell{2, 16}, 700, 50, 0, false, 0, false, 1, false}, // its reference failed, no ceiling
	} {
		p, ok := s.Point(c.name, c.cell)
		if !ok {
			t.Errorf("%s at %s: missing", c.name, c.cell)
			continue
		}
		if p.OrdersRPS != c.rps || p.P99 != c.p99 || p.Ratio != c.ratio || p.HasRatio != c.hasRatio ||
			p.CeilingRatio != c.top || p.HasCeiling != c.hasTop || p.Ran != c.ran || p.Unsafe != c.unsafe {
			t.Errorf("%s at %s: %+v, want orders/s %v p99 %v ratio %v (%v) to the ceiling %v (%v) ran %d unsafe %v",
				c.name, c.cell, p, c.rps, c.p99, c.ratio, c.hasRatio, c.top, c.hasTop, c.ran, c.unsafe)
		}
	}
	if _, ok := s.Point("redis/none", Cell{1, 1}); ok {
		t.Error("a cell that never ran has a point")
	}
}

// TestSweepTables: the Markdown a sweep prints, row by row, and the goal.
func TestSweepTables(t *testing.T) {
	var b strings.Builder
	WriteSweepTables(&b, craftedSweep())
	out := b.String()
	for _, want := range []string{
		"| run \\ replicas×SKUs | 1×4 | 2×16 | 3×1 |\n|---|---|---|---|\n",
		"| ceiling (GET /healthz, answers/s) | 1500 | - | 3000 |\n",
		"| none/atomic (reference) | 600 (ceiling 0.40) | FAILED | 900 [800–1000] (ceiling 0.30) |\n",
		"| redis/none | 300 (0.50; ceiling 0.20) | 700 | 450 (0.50; ceiling 0.15) |\n",
		"| local/none | - | - | 1200 (1.33; ceiling 0.40) ! |\n",
		"| etcd/none | - | - | FAILED |\n",
		"| redis/none | 200 | 50 | 300 |\n", // p99
		"! = a run that broke an invariant",
		"ratio to none/atomic: redis/none 0.50; local/none 1.33;\n",
		"ratio to the ceiling: none/atomic 0.30; redis/none 0.15; local/none 0.40;\n",
		"Goal redis/none >= 1.00 of none/atomic: 0.50, missed by 0.50.\n",
		// local is no shared lock; a lock that failed is not measured.
		"Goal every shared lock >= 2.00 of none/atomic (coalescing): redis/none 0.50, missed by 1.50; etcd/none not measured.\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tables lack %q:\n%s", want, out)
		}
	}

	// Below the goal, by how much.
	results := craftedSweep()
	results[2].OrdersRPS = 396 // 0.44 of 900
	b.Reset()
	WriteSweepTables(&b, results)
	if want := "Goal redis/none >= 1.00 of none/atomic: 0.44, missed by 0.56.\n"; !strings.Contains(b.String(), want) {
		t.Errorf("tables lack %q:\n%s", want, b.String())
	}
	// At the coalescing goal, met.
	results[2].OrdersRPS = 1800 // 2.00 of 900
	b.Reset()
	WriteSweepTables(&b, results)
	if want := "(coalescing): redis/none 2.00, met; etcd/none not measured.\n"; !strings.Contains(b.String(), want) {
		t.Errorf("tables lack %q:\n%s", want, b.String())
	}
}

// TestSweepQueue: a queue run is measured by its 202s per second (it
// answers no 201), its ratios to the reference's 201s and to the ceiling,
// its outcomes per second beside, and the queue's goals.
func TestSweepQueue(t *testing.T) {
	queue := sweepRun("none", "atomic", 3, 1, 0, 150)
	queue.Gate, queue.Accept, queue.AcceptedRPS, queue.SettledRPS = "redis", "queue", 2700, 2500
	queue.Status = map[string]int{"202": 400}
	gated := sweepRun("none", "atomic", 3, 1, 950, 110)
	gated.Gate = "redis"
	results := []Result{sweepRun("none", "atomic", 3, 1, 500, 100), ceilingRun(3, 1, 5000), gated, queue, sweepRun("none", "atomic", 3, 1, 500, 100)}
	s := NewSweep(results)
	if p, _ := s.Point("none/atomic", HotCell); p.OrdersRPS != 500 || p.Runs != 2 {
		t.Errorf("reference %+v: want its two runs, 500/s (the gated and queue runs are not the reference)", p)
	}
	p, ok := s.Point("none/atomic+gate+queue", HotCell)
	if !ok || p.OrdersRPS != 2700 || p.Ratio != 5.4 || p.CeilingRatio != 0.54 || !p.Queue || p.SettledRPS != 2500 {
		t.Errorf("queue point %+v: want 2700 accepted/s, ratios 5.4 and 0.54, settled 2500/s", p)
	}
	var b strings.Builder
	WriteSweepTables(&b, results)
	for _, want := range []string{
		"| none/atomic+gate+queue | 2700 accepted (5.40; ceiling 0.54), settled 2500/s |\n",
		"| none/atomic+gate | 950 (1.90; ceiling 0.19) |\n",
		"Goal none/atomic+gate+queue accepted >= 5x none/atomic's orders: 5.40, met; >= 0.5x the ceiling: 0.54, met (settled 2500/s).\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("tables lack %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	WriteSweep(&b, Report{Results: results, Command: "lab --sweep", Started: time.Unix(0, 0).UTC()})
	if want := "| 4 | none/atomic+gate+queue | 3 | 1 | 2700 | 5.40 | 0.54 |"; !strings.Contains(b.String(), want) {
		t.Errorf("sweep.md lacks %q:\n%s", want, b.String())
	}
}

// TestSweepFile: sweep.md names the settings and lists every run with its
// ratios to its cell's reference and ceiling.
func TestSweepFile(t *testing.T) {
	var b strings.Builder
	WriteSweep(&b, Report{Results: craftedSweep(), Command: "lab --sweep", Started: time.Unix(0, 0).UTC(), Wall: 90 * time.Second})
	out := b.String()
	for _, want := range []string{
		"`lab --sweep`", "12 runs", "400 orders", "64 in flight", "unpaced", "work delay 0s",
		"| 2 | ceiling | 3 | 1 | 3000 | - | - | 0 | 20 | 200×400 | - | ceiling: no stock, nothing to break |\n",
		"| 3 | redis/none | 3 | 1 | 450 | 0.50 | 0.15 | 0 | 300 | 201×400 | - | safe |\n",
		"| 5 | etcd/none | 3 | 1 | - | - | - | - | - | - | - | FAILED: etcd server: not installed |\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("sweep.md lacks %q:\n%s", want, out)
		}
	}
}

func TestStatusKiB(t *testing.T) {
	status := "Name:\torderd\nVmPeak:\t 1290412 kB\nVmHWM:\t   35312 kB\nVmRSS:\t   30100 kB\n"
	if n, ok := statusKiB(status, "VmHWM"); !ok || n != 35312 {
		t.Errorf("VmHWM = %d, %v; want 35312", n, ok)
	}
	if _, ok := statusKiB(status, "VmSwap"); ok {
		t.Error("VmSwap found in a status without it")
	}
}

// TestCeilingRow: the results table shows what a ceiling run measured
// (answers, answers/s, latency) and a dash where stock, locks and
// invariants would be: it has none, and zeros would read as measurements.
func TestCeilingRow(t *testing.T) {
	r := ceilingRun(3, 1, 3000)
	r.LatencyMS.P50 = 4
	got := strings.Join(cells(r), " | ")
	want := "ceiling | ceiling: no stock, nothing to break | 200×400 | - | - | - | - | - | - | - | 3000 | 4.0 | 20.0 | - | - | -"
	if got != want {
		t.Errorf("row\n%s\nwant\n%s", got, want)
	}
}
