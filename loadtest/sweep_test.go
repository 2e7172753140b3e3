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

func craftedSweep() []Result {
	failed := sweepRun("etcd", "none", 3, 1, 0, 0)
	failed.Error, failed.Safe = "etcd server: not installed", false
	unsafe := sweepRun("local", "none", 3, 1, 1200, 90)
	unsafe.LostUpdates, unsafe.Safe = 37, false
	fault := sweepRun("redis", "none", 3, 1, 10, 5000)
	fault.Fault = "pause-holder"
	return []Result{
		// Cell 3×1, the hot cell: the ceiling straddles the others.
		sweepRun("none", "atomic", 3, 1, 800, 100),
		sweepRun("redis", "none", 3, 1, 450, 300),
		unsafe,
		failed,
		fault,
		sweepRun("none", "atomic", 3, 1, 1000, 140),
		// Cell 1×4, listed after but sorted before; its ceiling comes last.
		sweepRun("redis", "none", 1, 4, 300, 200),
		sweepRun("none", "atomic", 1, 4, 600, 80),
		// A redis run whose ceiling failed: no ratio.
		func() Result { r := sweepRun("none", "atomic", 2, 16, 0, 0); r.Error = "boom"; return r }(),
		sweepRun("redis", "none", 2, 16, 700, 50),
	}
}

// TestSweepMath: the ceiling of a cell is the mean of its runs there, each
// point's ratio is against its own cell's ceiling, and failed, unsafe and
// fault runs are told apart.
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
	if want := []string{"none/atomic", "redis/none", "local/none", "etcd/none"}; strings.Join(s.Names, ",") != strings.Join(want, ",") {
		t.Errorf("names %v, want %v (ceiling first, fault runs left out)", s.Names, want)
	}

	type check struct {
		name     string
		cell     Cell
		rps, p99 float64
		ratio    float64
		hasRatio bool
		ran      int
		unsafe   bool
	}
	for _, c := range []check{
		{"none/atomic", Cell{3, 1}, 900, 120, 1, true, 2, false}, // mean of 800 and 1000
		{"redis/none", Cell{3, 1}, 450, 300, 0.5, true, 1, false},
		{"local/none", Cell{3, 1}, 1200, 90, 1.33, true, 1, true},
		{"etcd/none", Cell{3, 1}, 0, 0, 0, false, 0, false},
		{"redis/none", Cell{1, 4}, 300, 200, 0.5, true, 1, false},
		{"redis/none", Cell{2, 16}, 700, 50, 0, false, 1, false}, // its ceiling failed
	} {
		p, ok := s.Point(c.name, c.cell)
		if !ok {
			t.Errorf("%s at %s: missing", c.name, c.cell)
			continue
		}
		if p.OrdersRPS != c.rps || p.P99 != c.p99 || p.Ratio != c.ratio || p.HasRatio != c.hasRatio || p.Ran != c.ran || p.Unsafe != c.unsafe {
			t.Errorf("%s at %s: %+v, want orders/s %v p99 %v ratio %v (%v) ran %d unsafe %v",
				c.name, c.cell, p, c.rps, c.p99, c.ratio, c.hasRatio, c.ran, c.unsafe)
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
		"| none/atomic (ceiling) | 600 | FAILED | 900 [800–1000] |\n",
		"| redis/none | 300 (0.50) | 700 | 450 (0.50) |\n",
		"| local/none | - | - | 1200 (1.33) ! |\n",
		"| etcd/none | - | - | FAILED |\n",
		"| redis/none | 200 | 50 | 300 |\n", // p99
		"! = a run that broke an invariant",
		"ratio to the ceiling: redis/none 0.50; local/none 1.33;\n",
		"Goal redis/none >= 1.00 of the ceiling: 0.50, missed by 0.50.\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tables lack %q:\n%s", want, out)
		}
	}

	// Below the goal, by how much.
	results := craftedSweep()
	results[1].OrdersRPS = 396 // 0.44 of 900
	b.Reset()
	WriteSweepTables(&b, results)
	if want := "Goal redis/none >= 1.00 of the ceiling: 0.44, missed by 0.56.\n"; !strings.Contains(b.String(), want) {
		t.Errorf("tables lack %q:\n%s", want, b.String())
	}
}

// TestSweepFile: sweep.md names the settings and lists every run with its
// ratio to its cell's ceiling.
func TestSweepFile(t *testing.T) {
	var b strings.Builder
	WriteSweep(&b, Report{Results: craftedSweep(), Command: "lab --sweep", Started: time.Unix(0, 0).UTC(), Wall: 90 * time.Second})
	out := b.String()
	for _, want := range []string{
		"`lab --sweep`", "10 runs", "400 orders", "64 in flight", "unpaced", "work delay 0s",
		"| 2 | redis/none | 3 | 1 | 450 | 0.50 | 0 | 300 | 201×400 | - | safe |\n",
		"| 4 | etcd/none | 3 | 1 | - | - | - | - | - | - | FAILED: etcd server: not installed |\n",
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
