package loadtest

import (
	"strings"
	"testing"
)

// TestSummary: the sentences name what broke and by how much, what held,
// and the fastest safe run against the lock-free reference; a failed or
// unsafe run is never called the fastest safe one.
func TestSummary(t *testing.T) {
	run := func(backend, guard string, rps float64, oversold int) Result {
		return Result{Backend: backend, Guard: guard, ThroughputRPS: rps, Oversold: oversold, LostUpdates: oversold,
			OrderedQuantity: 100 + oversold, InitialStock: 100, Safe: oversold == 0}
	}
	got := strings.Join(Summary([]Result{
		run("local", "none", 1500, 198), // fastest, but unsafe
		run("redis", "none", 500, 0),
		run("etcd", "none", 250, 0),
		run("none", "atomic", 1000, 0),
		{Backend: "mysql", Guard: "none", Error: "could not start", ThroughputRPS: 9000},
	}), " ")
	for _, want := range []string{
		"1 of 5 runs could not be made",
		"1 of 4 runs broke an invariant: local/none oversold 198 (sold 298 of 100), lost 198 updates.",
		"Every invariant held in the other 3: redis/none; etcd/none; none/atomic.",
		"The fastest safe configuration is redis/none at 500 requests/s, 0.50× the lock-free reference none/atomic (1000 requests/s)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary %q\nlacks %q", got, want)
		}
	}
}

// TestSummaryHistory: Porcupine's verdicts are counted, timed-out checks
// among them, and the runs where it and the invariant checker disagree are
// named; runs that were not checked (or could not run) are not counted.
func TestSummaryHistory(t *testing.T) {
	run := func(backend, guard, lin string, oversold int) Result {
		return Result{Backend: backend, Guard: guard, Linearizable: lin, Oversold: oversold, Safe: oversold == 0}
	}
	got := strings.Join(Summary([]Result{
		run("local", "none", NotLinearizable, 5),
		run("local", "version", NotLinearizable, 0), // an early sellout
		run("redis", "none", Linearizable, 0),
		run("etcd", "none", HistoryUnknown, 0),
		run("zookeeper", "none", Linearizable, 2), // the fault's own orders
		run("mysql", "none", "", 0),               // not checked
		{Backend: "redlock", Guard: "none", Error: "could not start", Linearizable: Linearizable},
	}), " ")
	for _, want := range []string{
		"Porcupine's check of the load's history (at most 10s a run): linearizable in 2, not linearizable in 2, unknown (timed out) in 1 of 5 runs.",
		"Not linearizable although nothing was oversold or lost: local/version (see their notes).",
		"Linearizable although an invariant broke: zookeeper/none (see their notes).",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary %q\nlacks %q", got, want)
		}
	}
	if got := historySummary([]Result{run("redis", "none", "", 0)}); got != nil {
		t.Errorf("no run checked: %q, want no sentence", got)
	}
}
