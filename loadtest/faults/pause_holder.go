package faults

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oversold-lab/oversold/loadtest"
)

// leaseBackends are the backends whose locks are leases: a holder that
// stops long enough loses its lock to the next waiter without knowing it.
var leaseBackends = []string{"redis", "redlock", "zookeeper", "mysql", "etcd"}

// PauseHolder is Kleppmann's process pause ("How to do distributed locking",
// 2016; Jepsen's SIGSTOP "pause" nemesis; Curator's tech note 10 for
// ZooKeeper): a replica is frozen inside its critical section for twice the
// lease's lifetime, then resumed. While it is frozen the server expires its
// lease and another replica takes the same lock: two holders at once.
//
// The pause strikes at the hook before COMMIT: after the stock was read,
// the guarded UPDATE and the order INSERT sent, and the replica's last
// Lost() check passed. Earlier (before the write) the frozen replica's own
// watchdog would close Lost the instant it resumes and the write would be
// skipped: orderd checks Lost() before the transaction and again right
// before COMMIT. A real pause can fall after that last check, and no check
// can see it; that is the window shown here. SIGSTOP freezes the watchdog
// and the session goroutines too, which a sleep would not.
//
// The frozen transaction holds InnoDB's row lock on the SKU, so the second
// holder's UPDATE waits for it and runs right after the frozen one commits,
// on a stock it read before: guard none loses an update (or oversells on the
// last units); guard version refuses it (the version moved); guard fencing
// only checks that the writer's token is newer, which it is, so it lets the
// stale read through too: the limit DESIGN.md names for fencing, shown
// here rather than hidden.
func PauseHolder() loadtest.Fault { return pauseHolder(atBeforeCommit) }

// pauseHolder pauses one seeded replica at hook point point.
func pauseHolder(point string) loadtest.Fault {
	var runs perRun[*insideHook]
	return loadtest.Fault{
		Backends: leaseBackends,
		Prepare:  hookPrepare(&runs),
		Inject: func(ctx context.Context, run *loadtest.Run) error {
			hook, err := runs.get(run)
			if err != nil {
				return err
			}
			r, err := victimOf(run)
			if err != nil {
				return err
			}
			c, err := nth(ctx, hook, warmup(run), at(point, r.Name))
			if err != nil {
				eventf(run, "the load ended before %s reached the pause point", r.Name)
				return nil
			}
			defer c.Answer()
			d := 2 * leaseLife(run)
			if err := r.Pause(); err != nil {
				return fmt.Errorf("pause %s: %w", r.Name, err)
			}
			// Always resumed, whatever happens below.
			resumed := false
			resume := func() error {
				if resumed {
					return nil
				}
				resumed = true
				return r.Resume()
			}
			defer resume()
			t0 := time.Now()
			eventf(run, "%s frozen (SIGSTOP) for %s", c, d)
			// Note the first other replica let into the same lock meanwhile.
			wait, cancel := context.WithTimeout(ctx, d)
			if c2, err := hook.next(wait, secondHolder(c)); err == nil {
				c2.Answer()
				eventf(run, "%s took the same lock %s into the pause", c2, since(t0))
			}
			cancel()
			if err := sleepCtx(ctx, d-time.Since(t0)); err != nil {
				eventf(run, "the load ended %s into the pause", since(t0))
			}
			if err := resume(); err != nil {
				return fmt.Errorf("resume %s: %w", r.Name, err)
			}
			c.Answer()
			eventf(run, "%s resumed (SIGCONT) after %s and went on", r.Name, since(t0))
			return nil
		},
	}
}

// victimOf draws the replica a fault strikes from the run's seed.
func victimOf(run *loadtest.Run) (*loadtest.Replica, error) {
	if run.Fleet == nil || len(run.Fleet.Replicas) == 0 {
		return nil, errors.New("no replicas started by the lab")
	}
	return run.Fleet.Replicas[run.Rand.IntN(len(run.Fleet.Replicas))], nil
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
