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
