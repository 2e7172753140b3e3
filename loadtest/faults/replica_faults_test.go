package faults_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/oversold-lab/oversold/loadtest"
)

// TestPauseHolder checks what pause-holder must show: a holder
// frozen after its read and its one Lost check, before its write, past its
// lease, makes two holders at once on every lease backend; with guard none
// its resumed write loses an update (or oversells); guard fencing refuses
// it (an older token than the fence the next holder left) and guard
// version refuses it (the version moved).
func TestPauseHolder(t *testing.T) {
	for _, backend := range []string{"redis", "redlock", "zookeeper", "mysql", "etcd"} {
		t.Run(backend+"/none", func(t *testing.T) {
			r := runFault(t, short("pause-holder", backend, "none"))
			assertFired(t, r)
			assertBroken(t, r)
		})
	}
	for _, tc := range []struct{ backend, guard string }{{"redis", "fencing"}, {"redis", "version"}} {
		t.Run(tc.backend+"/"+tc.guard, func(t *testing.T) {
			r := runFault(t, short("pause-holder", tc.backend, tc.guard))
			assertFired(t, r)
			if r.Overlaps == 0 {
				t.Errorf("no two holders overlapped: %v", r.FaultEvents)
			}
			assertSafe(t, r)
			assertRefused(t, r)
			assertStruckBatch(t, r, "refused")
		})
	}
	t.Run("local is not applicable", func(t *testing.T) {
		r := runFault(t, short("pause-holder", "local", "none"))
		if !r.NotApplicable || r.Safe {
			t.Errorf("local: not applicable %v, safe %v; want a run reported not applicable", r.NotApplicable, r.Safe)
		}
	})
	t.Run("redlock/fencing is not applicable", func(t *testing.T) {
		r := runFault(t, short("pause-holder", "redlock", "fencing"))
		if !r.NotApplicable {
			t.Errorf("redlock/fencing: %s; want not applicable (no token)", r.Verdict())
		}
	})
}

// TestPauseAfterCommit: a holder paused between its commit and its cache
// update, past its lease. Guard fencing's holder deleted the entry before
// writing, so the next holder reads the committed stock from MySQL and
// nothing is lost (before that change: a lost update every time); guard
// version leaves the entry, refuses the stale read and refreshes. Guard
// none is run and reported only: SIGSTOP freezes the whole replica, which
// may also be inside a batch of the run's hot SKU between its read and its
// write, and guard none then loses that update (pause-holder's lesson).
func TestPauseAfterCommit(t *testing.T) {
	for _, guard := range []string{"none", "fencing", "version"} {
		t.Run("redis/"+guard, func(t *testing.T) {
			r := runFault(t, short("pause-after-commit", "redis", guard))
			assertFired(t, r)
			if r.Overlaps == 0 {
				t.Errorf("no two holders overlapped: %v", r.FaultEvents)
			}
			switch guard {
			case "fencing":
				assertSafe(t, r)
			case "version":
				assertSafe(t, r)
				assertRefused(t, r)
			}
		})
	}
}

// TestKillHolder: a holder killed inside its critical section costs its SKU
// one lease lifetime, and loses nothing acknowledged.
func TestKillHolder(t *testing.T) {
	for _, tc := range []struct{ backend, guard string }{{"redis", "fencing"}, {"zookeeper", "version"}} {
		t.Run(tc.backend+"/"+tc.guard, func(t *testing.T) {
			r := runFault(t, short("kill-holder", tc.backend, tc.guard))
			assertFired(t, r)
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
			assertFired(t, r)
			assertSafe(t, r)
		})
	}
}

// TestCrashAfterCommit: a retried key after a crash gets the committed order
// back, once, and every invariant holds: the kill also ends whatever else
// the victim had in flight, but a holder of guard none deletes its cache
// entry before it writes, so one killed between its commit and its cache
// update leaves the next holder a miss, not a stale stock.
func TestCrashAfterCommit(t *testing.T) {
	for _, guard := range []string{"version", "none"} {
		t.Run("redis/"+guard, func(t *testing.T) {
			r := runFault(t, short("crash-after-commit", "redis", guard))
			assertFired(t, r)
			if len(r.Violations) > 0 {
				t.Errorf("retry after the crash: %v", r.Violations)
			}
			if len(r.FaultEvents) < 3 {
				t.Errorf("the crash and retry did not happen: %v", r.FaultEvents)
			}
			assertSafe(t, r)
			// The batch committed whole, and each of its keys, retried,
			// got its order back (the fault checks each one: violations).
			assertStruckBatch(t, r, "committed")
			if n := countEvents(r, "answered 200"); n < 2 {
				t.Errorf("%d retries answered 200 with the committed order, want one per order of the struck batch: %v", n, r.FaultEvents)
			}
		})
	}
}

// assertStruckBatch: the fault struck a coalesced batch, not a lone order
// (coalescing is on by default): the replicas' write records show a write
// of the fault's own SKU, with outcome, that carried more than one order.
// enterBatch queues 4; one that reached the replica too late for the batch
// (its queueSettle is a wait, not a handshake) is sold after it.
func assertStruckBatch(t *testing.T, r loadtest.Result, outcome string) {
	t.Helper()
	_, writes, err := loadtest.ReadRecords(r.ReplicaLogs)
	if err != nil {
		t.Fatal(err)
	}
	most := 0
	for _, w := range writes {
		if strings.HasPrefix(w.SKU, "fault-") && w.Outcome == outcome {
			most = max(most, w.Orders)
		}
	}
	if most < 2 {
		t.Errorf("%s: the largest %s write of the fault's SKU carried %d orders, want a batch (4 queued)", r.Name(), outcome, most)
	}
}

func countEvents(r loadtest.Result, part string) int {
	n := 0
	for _, e := range r.FaultEvents {
		if strings.Contains(e, part) {
			n++
		}
	}
	return n
}

// assertFired fails a run whose fault never struck: its invariants would
// say nothing about the fault.
func assertFired(t *testing.T, r loadtest.Result) {
	t.Helper()
	if r.NotFired {
		t.Fatalf("%s: the fault did not fire: %v", r.Name(), r.FaultEvents)
	}
}

// assertBroken: guard none (or a guard past its limit) must show the fault
// breaking an invariant: a lost update or an oversell.
func assertBroken(t *testing.T, r loadtest.Result) {
	t.Helper()
	if r.Overlaps == 0 {
		t.Errorf("%s: no two holders overlapped: %v", r.Name(), r.FaultEvents)
	}
	if r.Oversold == 0 && r.LostUpdates == 0 {
		t.Errorf("%s: %s; want a lost update or an oversell (%v)", r.Name(), r.Verdict(), r.FaultEvents)
	}
}

// assertRefused: the guard refused the stale write.
func assertRefused(t *testing.T, r loadtest.Result) {
	t.Helper()
	if r.StaleWritesRefused == 0 {
		t.Errorf("%s: the guard refused no stale write (%v)", r.Name(), r.FaultEvents)
	}
}

func assertSafe(t *testing.T, r loadtest.Result) {
	t.Helper()
	if !r.Safe {
		t.Errorf("%s: %s; want every invariant kept (%v)", r.Name(), r.Verdict(), r.FaultEvents)
	}
}

// TestQueueConsumerKill: a replica killed in the middle of its queue
// consumer's batch, before its COMMIT (seed 1) or after it, before the
// acknowledgement (seed 2): another replica claims the entries after the
// claim bound and writes each once, or finds it written and only settles
// it; no 202 is lost or left pending, none is sold twice.
func TestQueueConsumerKill(t *testing.T) {
	for _, seed := range []int64{1, 2} {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			spec := short("queue-consumer-kill", "none", "atomic")
			spec.Gate, spec.Accept, spec.Seed = "redis", "queue", seed
			r := runFault(t, spec)
			assertFired(t, r)
			assertSafe(t, r)
			if r.Accepted == nil || r.LostAccepted == nil || r.PendingLeft == nil || r.RejectedAfterAccept == nil {
				t.Fatalf("no queue figures: %+v", r)
			}
			if *r.Accepted == 0 || *r.LostAccepted != 0 || *r.PendingLeft != 0 {
				t.Errorf("accepted %d, lost %d, pending %d: want every 202 written", *r.Accepted, *r.LostAccepted, *r.PendingLeft)
			}
			// The kill can also strike an accept whose script ran and
			// whose 202 never left: its order is written, its client saw
			// a 502 or no answer. Those may add to what was sold, never
			// more than them; duplicates are counted by key (assertSafe).
			confirmed := *r.Accepted - *r.RejectedAfterAccept
			unanswered := r.Status["502"] + r.NoResponse
			if r.OrderedQuantity < confirmed || r.OrderedQuantity > confirmed+unanswered {
				t.Errorf("sold %d, accepted %d, rejected %d, unanswered %d: want each confirmed order sold once", r.OrderedQuantity, *r.Accepted, *r.RejectedAfterAccept, unanswered)
			}
		})
	}
}
