package faults_test

import (
	"testing"

	"github.com/oversold-lab/oversold/loadtest"
)

// TestPauseHolder checks issue 5's expectations for pause-holder: a frozen
// holder makes two holders at once on every lease backend; with guard none
// that loses an update or oversells, and guard version keeps every
// invariant. Guard fencing is run and reported, not asserted: the pause
// strikes before COMMIT, with the frozen write already holding the row, and
// the newer holder's write then lands on a stale read with a newer token,
// which fencing alone accepts (see PauseHolder).
func TestPauseHolder(t *testing.T) {
	for _, backend := range []string{"redis", "redlock", "zookeeper", "mysql", "etcd"} {
		t.Run(backend+"/none", func(t *testing.T) {
			r := runFault(t, short("pause-holder", backend, "none"))
			if r.Overlaps == 0 {
				t.Errorf("no two holders overlapped: %v", r.FaultEvents)
			}
			if r.Oversold == 0 && r.LostUpdates == 0 {
				t.Errorf("guard none kept the invariants: the pause did not bite (%v)", r.FaultEvents)
			}
		})
	}
	t.Run("redis/version", func(t *testing.T) {
		r := runFault(t, short("pause-holder", "redis", "version"))
		if r.Overlaps == 0 {
			t.Errorf("no two holders overlapped: %v", r.FaultEvents)
		}
		if !r.Safe || r.StaleWritesRefused == 0 {
			t.Errorf("guard version: %s, %d refused; want safe and at least one refused", r.Verdict(), r.StaleWritesRefused)
		}
	})
	t.Run("redis/fencing", func(t *testing.T) {
		r := runFault(t, short("pause-holder", "redis", "fencing"))
		t.Logf("guard fencing under a pause before COMMIT: %s (reported, not asserted)", r.Verdict())
	})
	t.Run("local is not applicable", func(t *testing.T) {
		r := runFault(t, short("pause-holder", "local", "none"))
		if !r.NotApplicable || r.Safe {
			t.Errorf("local: not applicable %v, safe %v; want a run reported not applicable", r.NotApplicable, r.Safe)
		}
	})
}

// TestKillHolder: a holder killed inside its critical section costs its SKU
// one lease lifetime, and loses nothing acknowledged.
func TestKillHolder(t *testing.T) {
	for _, tc := range []struct{ backend, guard string }{{"redis", "fencing"}, {"zookeeper", "version"}} {
		t.Run(tc.backend+"/"+tc.guard, func(t *testing.T) {
			r := runFault(t, short("kill-holder", tc.backend, tc.guard))
			assertSafe(t, r)
			if r.RecoveryMS == nil {
				t.Fatalf("no recovery measured: %v", r.FaultEvents)
			}
			// The lease outlives the dead holder by about one TTL (1 s).
			if *r.RecoveryMS < 500 || *r.RecoveryMS > 8000 {
				t.Errorf("recovery %v ms, want about one lease lifetime", *r.RecoveryMS)
			}
		})
	}
}

// TestMySQLConnectionKill: connections killed before COMMIT roll their
// transaction back whole.
func TestMySQLConnectionKill(t *testing.T) {
	for _, guard := range []string{"none", "fencing"} {
		t.Run("redis/"+guard, func(t *testing.T) {
			r := runFault(t, short("mysql-connection-kill", "redis", guard))
			assertSafe(t, r)
			if len(r.FaultEvents) == 0 {
				t.Errorf("no connection killed")
			}
		})
	}
}

// TestCrashAfterCommit: a retried key after a crash gets the committed order
// back, once. Guard version must keep every invariant; guard none is run and
// reported only: the kill also ends whatever else the victim had in flight,
// and an order killed between its commit and its cache update leaves a
// stale cache entry that guard none (and fencing) trusts, as DESIGN.md says.
func TestCrashAfterCommit(t *testing.T) {
	for _, guard := range []string{"version", "none"} {
		t.Run("redis/"+guard, func(t *testing.T) {
			r := runFault(t, short("crash-after-commit", "redis", guard))
			if len(r.Violations) > 0 {
				t.Errorf("retry after the crash: %v", r.Violations)
			}
			if len(r.FaultEvents) < 3 {
				t.Errorf("the crash and retry did not happen: %v", r.FaultEvents)
			}
			if guard == "version" {
				assertSafe(t, r)
			}
		})
	}
}

func assertSafe(t *testing.T, r loadtest.Result) {
	t.Helper()
	if !r.Safe {
		t.Errorf("%s: %s; want every invariant kept (%v)", r.Name(), r.Verdict(), r.FaultEvents)
	}
}
