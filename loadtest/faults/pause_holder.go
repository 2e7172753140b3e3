package faults

import (
	"context"
	"fmt"
	"time"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/loadtest"
)

// leaseBackends are the backends whose locks are leases: a holder that
// stops long enough loses its lock to the next waiter without knowing it.
var leaseBackends = []string{"redis", "redlock", "zookeeper", "mysql", "etcd"}

// PauseHolder is Kleppmann's process pause ("How to do distributed locking",
// 2016; Jepsen's SIGSTOP "pause" nemesis; Curator's tech note 10 for
// ZooKeeper): a replica is frozen inside its critical section, after it read
// the stock and before it writes, until its lease expired and another
// replica took the same lock and wrote; then it is resumed.
//
// The pause strikes at the hook before the write, which comes right after
// the flow's one Lost() check: the frozen replica resumes past that check
// and writes with a lease it no longer holds, and no check made before a
// pause can see one (SIGSTOP freezes its watchdog and session goroutines
// too, which a sleep would not). The fault drives the orders itself, on
// the run's fault SKU: a batch to the struck replica (the seed draws it;
// enterBatch), one order to the next replica once the first is frozen;
// the second waits for the lease to expire, takes the lock, and writes. Guard none: the resumed write
// overwrites it with a stock read before it (a lost update). Guard fencing:
// the resumed write carries an older token than the fence the second
// holder left: refused (409 lock_lost). Guard version: the version moved:
// refused, and the flow retries from a fresh read.
func PauseHolder() loadtest.Fault { return pauseHolder(atBeforeWrite) }

// PauseAfterCommit is the limit docs/design.md admits for the fencing guard: a
// holder paused between its COMMIT and its cache update (step 7) past its
// lease leaves the cache one write behind MySQL, and the next holder, with
// a newer token, trusts that stale entry. Fencing validates only the
// writer, not what it read, so guard none and guard fencing both lose the
// paused holder's decrement; guard version validates the read as well: the
// stale write is refused, the cache refreshed from MySQL, and the retry
// writes the truth.
func PauseAfterCommit() loadtest.Fault { return pauseHolder(atBeforeCache) }

// pauseHolder freezes the struck replica's own order at hook point point.
func pauseHolder(point string) loadtest.Fault {
	f := drivenFault(func(ctx context.Context, run *loadtest.Run, d *driver, r, next *loadtest.Replica) error {
		life := leaseLife(run)

		c, first, _ := d.enterBatch(ctx, r, point, "paused")
		if c == nil {
			return nil
		}
		defer c.Answer()
		resume, err := pause(r)
		if err != nil {
			return err
		}
		defer resume() // always resumed, whatever happens below
		t0 := time.Now()
		run.Fired("%s frozen (SIGSTOP) at %s, holding its lease", c, point)

		// The second holder: another replica, the same SKU. It waits
		// for the frozen holder's lease to expire.
		c2, second, err := d.sendCaught(ctx, next, atBeforeWrite, "second", life+lockWait)
		if err == nil {
			run.Eventf("%s took the same lock %s into the pause and writes", c2, since(t0))
			c2.Answer()
		} else {
			run.Eventf("no second holder during the pause: %v", err)
		}
		d.wait(ctx, second, life+lockWait)
		if point == atBeforeCache {
			if run.Spec.Guard == "version" {
				run.Eventf("the second holder read the cache entry the frozen holder had not updated: guard version validates the read, so that stale write was refused and the cache refreshed from MySQL")
			} else {
				run.Eventf("the frozen holder had deleted the SKU's cache entry before its write (guard %s trusts the cached read): the second holder missed, read the committed stock from MySQL and lost nothing", run.Spec.Guard)
			}
		}
		// Frozen for at least twice the lease's life in any case.
		_ = clock.Sleep(ctx, 2*life-time.Since(t0))
		if err := resume(); err != nil {
			return fmt.Errorf("resume %s: %w", r.Name, err)
		}
		c.Answer()
		run.Eventf("%s resumed (SIGCONT) after %s and went on with its lost lease", r.Name, since(t0))
		d.wait(ctx, first, faultLimit/2)
		return nil
	})
	f.Backends = leaseBackends
	return f
}

// pause freezes r (SIGSTOP) and returns what resumes it (SIGCONT), once
// however often it is called.
func pause(r *loadtest.Replica) (resume func() error, err error) {
	if err := r.Pause(); err != nil {
		return nil, fmt.Errorf("pause %s: %w", r.Name, err)
	}
	resumed := false
	return func() error {
		if resumed {
			return nil
		}
		resumed = true
		return r.Resume()
	}, nil
}

// leaseLife is how long a lease outlives its holder's last renewal on the
// run's backend: the TTL, except where the server rounds it. etcd grants
// whole seconds and at least 1.5 election timeouts (2 s by default);
// ZooKeeper clamps the session timeout to 2..20 ticks, at most the TTL
// asked for on the testbed's 200 ms tick.
func leaseLife(run *loadtest.Run) time.Duration {
	d := ttl(run)
	if run.Spec.Backend == "etcd" {
		d = max(d.Truncate(time.Second), 2*time.Second)
		if d < ttl(run) {
			d += time.Second
		}
	}
	return d
}
