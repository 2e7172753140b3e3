package faults_test

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/loadtest"
)

// The accept queue's faults, each on a short queue run (none/atomic, the
// gate, accept queue): every 202 must end confirmed or rejected, once,
// unless the fault is one that loses accepted orders, and then the run
// counts exactly those.

func queueSpec(fault, guard string) loadtest.Spec {
	spec := short(fault, "none", guard)
	spec.Gate, spec.Accept = "redis", "queue"
	return spec
}

// queueFigures returns the run's queue figures, failing the test when it
// has none.
func queueFigures(t *testing.T, r loadtest.Result) (accepted, rejected, lost, pending int) {
	t.Helper()
	if r.Accepted == nil || r.RejectedAfterAccept == nil || r.LostAccepted == nil || r.PendingLeft == nil {
		t.Fatalf("%s: no queue figures", r.Name())
	}
	return *r.Accepted, *r.RejectedAfterAccept, *r.LostAccepted, *r.PendingLeft
}

var restartQueued = regexp.MustCompile(`with (\d+) accepted orders not settled in its stream \((\d+) unread`)

// TestQueueRedisRestart: the queue's Redis is restarted while accepted
// orders wait in its stream (every consumer held before its first write).
// Without persistence the orders no consumer had read are lost, and the
// run counts them (lost_accepted, at most what was unread); the counters
// are seeded again from MySQL, so the gate admits orders after the restart,
// at most the held batches' orders too many (rejected after their 202), and
// guard atomic keeps every invariant MySQL holds. With appendonly yes
// and appendfsync always nothing is lost. In both, no 202 is left pending
// and each confirmed order is sold once.
func TestQueueRedisRestart(t *testing.T) {
	for _, fault := range []string{"queue-redis-restart", "queue-redis-restart-fsync"} {
		t.Run(fault, func(t *testing.T) {
			// Lost orders are waited for the whole drain (90 s) before
			// they are counted lost.
			r := runFaultWithin(t, queueSpec(fault, "atomic"), 3*time.Minute)
			assertFired(t, r)
			accepted, rejected, lost, pending := queueFigures(t, r)
			var queued, unread int
			for _, e := range r.FaultEvents {
				if m := restartQueued.FindStringSubmatch(e); m != nil {
					queued, _ = strconv.Atoi(m[1])
					unread, _ = strconv.Atoi(m[2])
				}
			}
			if queued == 0 {
				t.Fatalf("the restart found no order queued: %v", r.FaultEvents)
			}
			if r.Oversold != 0 || r.LostUpdates != 0 || r.LostAcks != 0 || r.Duplicates != 0 || len(r.Violations) != 0 {
				t.Errorf("%s: %s; want guard atomic to keep MySQL's invariants", r.Name(), r.Verdict())
			}
			if pending != 0 {
				t.Errorf("%d accepted orders left pending: want each written, or lost with the restart", pending)
			}
			if r.OrderedQuantity != accepted-rejected-lost {
				t.Errorf("sold %d, accepted %d, rejected %d, lost %d: want each confirmed order sold once", r.OrderedQuantity, accepted, rejected, lost)
			}
			// The held batches' orders are taken from the new counter as
			// they settle: until then, they are all it admits beyond
			// MySQL (given back, each rejection would admit another).
			if read := queued - unread; rejected > read {
				t.Errorf("rejected %d after their 202, %d orders held by consumers at the restart: want at most those rejected", rejected, read)
			}
			if accepted <= queued {
				t.Errorf("accepted %d, %d of them before the restart: want the gate seeded again and admitting after it", accepted, queued)
			}
			if fault == "queue-redis-restart-fsync" {
				if lost != 0 || rejected != 0 {
					t.Errorf("lost %d and rejected %d accepted orders with appendfsync always: want none", lost, rejected)
				}
				return
			}
			if lost == 0 || lost > unread {
				t.Errorf("lost %d accepted orders, %d unread at the restart: want the unread ones lost, and only those", lost, unread)
			}
		})
	}
}

// TestQueueMySQLConnectionKill: MariaDB connections killed while a queue
// consumer's batch is about to commit: the batch rolls back whole, its
// entries stay unacknowledged and are written again, so every 202, the
// fault's own included, ends confirmed or rejected, once.
func TestQueueMySQLConnectionKill(t *testing.T) {
	r := runFault(t, queueSpec("mysql-connection-kill", "atomic"))
	assertFired(t, r)
	assertSafe(t, r)
	accepted, rejected, lost, pending := queueFigures(t, r)
	if lost != 0 || pending != 0 {
		t.Errorf("lost %d, pending %d: want every 202 written", lost, pending)
	}
	if r.OrderedQuantity != accepted-rejected {
		t.Errorf("sold %d, accepted %d, rejected %d: want each confirmed order sold once", r.OrderedQuantity, accepted, rejected)
	}
	if n := countEvents(r, "about to commit: killed"); n == 0 {
		t.Errorf("no consumer's batch struck: %v", r.FaultEvents)
	}
	if n := countEvents(r, "answered 202"); n < 3 {
		t.Errorf("%d of the fault's own orders answered 202, want them drained too: %v", n, r.FaultEvents)
	}
}
