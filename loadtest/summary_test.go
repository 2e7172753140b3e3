package loadtest

import (
	"strings"
	"testing"
)

// TestSummary: the sentences name what broke and by how much, what held,
// and the pick (TestPick); a failed or unsafe run is never the pick.
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
		// The ceiling is faster than anything and safe, yet no configuration.
		{Backend: "none", Guard: "none", Workload: WorkloadCeiling, ThroughputRPS: 20000, Safe: true},
	}), " ")
	for _, want := range []string{
		"1 of 5 runs could not be made",
		"1 of 4 runs broke an invariant: local/none oversold 198 (sold 298 of 100), lost 198 updates.",
		"Every invariant held in the other 3: redis/none; etcd/none; none/atomic.",
		"Pick: none/atomic, the fastest configuration with a guard at 1000 requests/s (the lock-free reference).",
		"a run without faults proves nothing about a lease lock alone",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary %q\nlacks %q", got, want)
		}
	}
}

// TestPick: the pick is made from evidence. With fault runs, the fastest
// configuration that stayed safe in every one of its fault runs; without,
// the fastest guarded one, with the warning; never guard none, never a
// configuration unsafe anywhere, never one no fault struck.
func TestPick(t *testing.T) {
	plain := func(backend, guard string, rps float64, safe bool) Result {
		return Result{Backend: backend, Guard: guard, ThroughputRPS: rps, Safe: safe}
	}
	fault := func(backend, guard, fault string, safe bool) Result {
		r := plain(backend, guard, 5, safe) // a fault run's speed measures the fault
		r.Fault = fault
		return r
	}
	notFired := func(r Result) Result { r.NotFired = true; return r }
	tests := []struct {
		name    string
		results []Result
		want    string // the pick's sentence begins so
		also    []string
		not     []string
	}{{
		name: "faults: the fastest guarded configuration safe in every fault run",
		results: []Result{
			plain("local", "none", 2000, false),
			plain("redis", "none", 1500, true), // fastest safe without a fault
			plain("redis", "version", 1200, true),
			plain("redis", "fencing", 900, true),
			plain("zookeeper", "fencing", 400, true),
			plain("none", "atomic", 1000, true),
			fault("redis", "none", "pause-holder", false),
			fault("redis", "version", "pause-holder", true),
			fault("redis", "version", "redis-failover", false), // unsafe once: out
			fault("redis", "fencing", "pause-holder", true),
			fault("redis", "fencing", "redis-failover", true),
			fault("zookeeper", "fencing", "pause-holder", true),
		},
		want: "Pick: redis/fencing, the fastest configuration that stayed safe in every fault run of this report (2 runs: pause-holder, redis-failover) at 900 requests/s, 0.90× the lock-free reference none/atomic (1000 requests/s).",
		not:  []string{"Pick: redis/none", "Pick: redis/version", "Pick: none/atomic", "fastest safe"},
	}, {
		name: "faults: a configuration a scenario of its lock never struck is not the pick",
		results: []Result{
			plain("redis", "version", 1500, true),
			plain("redis", "fencing", 900, true),
			plain("zookeeper", "fencing", 1200, true), // redis-failover does not apply to it
			fault("redis", "version", "redis-failover", true),
			fault("redis", "fencing", "redis-failover", true),
			fault("redis", "fencing", "pause-holder", true),
			fault("redis", "none", "kill-holder", false),
			fault("zookeeper", "fencing", "pause-holder", true),
		},
		want: "Pick: zookeeper/fencing, the fastest configuration that stayed safe in every fault run of this report (1 run: pause-holder) at 1200 requests/s",
		also: []string{"redis/version ran faster (1500 requests/s) and stayed safe where it ran, but pause-holder, kill-holder never struck it here"},
		not:  []string{"Pick: redis/version"},
	}, {
		name: "faults: guard none that survived its faults is still not the pick",
		results: []Result{
			plain("redis", "none", 1500, true),
			plain("etcd", "fencing", 300, true),
			fault("redis", "none", "kill-holder", true),
			fault("etcd", "fencing", "kill-holder", true),
		},
		want: "Pick: etcd/fencing, the fastest configuration that stayed safe in every fault run of this report (1 run: kill-holder) at 300 requests/s; this report has no lock-free reference",
		also: []string{"redis/none kept every invariant in its fault runs here, but guard none trusts the lock alone"},
		not:  []string{"Pick: redis/none"},
	}, {
		name: "faults: unsafe without a fault is out, and a fault that never fired is no evidence",
		results: []Result{
			plain("redis", "version", 1500, false),
			plain("mysql", "fencing", 900, true),
			plain("etcd", "fencing", 300, true),
			fault("redis", "version", "pause-holder", true),
			notFired(fault("mysql", "fencing", "pause-holder", true)),
			fault("etcd", "fencing", "pause-holder", true),
		},
		want: "Pick: etcd/fencing,",
		not:  []string{"Pick: redis/version", "Pick: mysql/fencing"},
	}, {
		name: "faults: only guard none ran under faults",
		results: []Result{
			plain("redis", "none", 1500, true),
			plain("redis", "fencing", 900, true),
			fault("redis", "none", "pause-holder", false),
		},
		want: "No pick: no configuration with a guard stayed safe in every fault run of this report",
		not:  []string{"Pick: redis"},
	}, {
		name: "no faults: the fastest guarded one, with the warning, never guard none",
		results: []Result{
			plain("local", "none", 2000, false),
			plain("redis", "none", 1500, true),
			plain("redis", "fencing", 900, true),
			plain("redis", "version", 1100, false),
		},
		want: "Pick: redis/fencing, the fastest configuration with a guard at 900 requests/s; this report has no lock-free reference",
		also: []string{
			"redis/none ran faster (1500 requests/s) and nothing oversold, but guard none trusts the lock alone: it is not called safe.",
			"No run here had a fault, and a run without faults proves nothing about a lease lock alone",
		},
		not: []string{"Pick: redis/none", "Pick: local/none", "Pick: redis/version"},
	}, {
		name: "no faults: the lock-free reference wins, and the fastest with a lock is named",
		results: []Result{
			plain("redis", "none", 1500, true),
			plain("redis", "fencing", 600, true),
			plain("none", "atomic", 1000, true),
			plain("none", "version", 70, true),
		},
		want: "Pick: none/atomic, the fastest configuration with a guard at 1000 requests/s (the lock-free reference).",
		also: []string{"The fastest with a lock and a guard: redis/fencing at 600 requests/s, 0.60× the lock-free reference none/atomic (1000 requests/s)."},
	}, {
		name:    "no faults: only guard none ran",
		results: []Result{plain("redis", "none", 1500, true), plain("etcd", "none", 300, true)},
		want:    "No pick: no configuration with a guard ran safely here.",
		not:     []string{"Pick: redis/none", "Pick: etcd/none"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Pick(tc.results)
			all := strings.Join(got, " ")
			if len(got) == 0 || !strings.HasPrefix(got[0], tc.want) {
				t.Errorf("pick %q\nwant it to begin %q", all, tc.want)
			}
			for _, s := range tc.also {
				if !strings.Contains(all, s) {
					t.Errorf("pick %q\nlacks %q", all, s)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(all, s) {
					t.Errorf("pick %q\nsays %q", all, s)
				}
			}
			if summary := strings.Join(Summary(tc.results), " "); !strings.Contains(summary, got[0]) {
				t.Errorf("the summary %q does not carry the pick", summary)
			}
		})
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

// TestConfigNamesTheGate: a gated run is another configuration than the
// same lock and guard without the gate, so the pick never credits one with
// the other's fault runs.
func TestConfigNamesTheGate(t *testing.T) {
	plain := Result{Backend: "none", Guard: "atomic"}
	gated := Result{Backend: "none", Guard: "atomic", Gate: "redis", Fault: "redis-restart"}
	if plain.Config() == gated.Config() {
		t.Fatalf("none/atomic and its gated run share the configuration %q", plain.Config())
	}
	if got := gated.Config(); got != "none/atomic+gate" {
		t.Errorf("gated Config %q, want none/atomic+gate", got)
	}
}
