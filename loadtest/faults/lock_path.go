package faults

import (
	"context"
	"fmt"
	"time"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// victim is the replica whose paths the network faults disturb: r1. Only it
// gets proxies; the others keep their direct paths, as in a partial
// partition.
const victim = 0

// prepareCut puts the victim behind proxies on paths, and returns them
// with their cleanup.
func prepareCut(run *loadtest.Run, paths ...string) (testbed.Proxies, func(), error) {
	var ps testbed.Proxies
	for _, path := range paths {
		more, err := proxyReplica(run, victim, path)
		if err != nil {
			ps.Close()
			return nil, nil, err
		}
		ps = append(ps, more...)
	}
	return ps, ps.Close, nil
}

// lockPathFault cuts or slows the victim's path to its lock server while it
// is inside its critical section, holds it there until its lease must be
// lost (Lost closes when the validity of the last confirmed renewal runs
// out, at most one TTL later, before the server can expire the lease) and
// another replica took the lock, then heals the path and lets the victim
// go on. The victim is held at the hook after its read, before its work and
// the flow's one Lost check: it must find its lease lost there and abort
// without writing (409 lock_lost): no invariant breaks, even with guard
// none. What differs between scenarios is the toxic: latency beyond the TTL
// (renewals time out) or a blackhole (a partition). The fault drives both
// orders itself, on the run's fault SKU: the victim's, and the second
// holder's on the next replica.
func lockPathFault(blackhole bool, backends []string) loadtest.Fault {
	return scenario[testbed.Proxies]{
		Backends: backends,
		Prepare: func(ctx context.Context, run *loadtest.Run) (testbed.Proxies, func(), error) {
			return prepareCut(run, pathLock)
		},
		Replicas: victimPair,
		Inject: func(ctx context.Context, run *loadtest.Run, dr *driver, ps testbed.Proxies, r, next *loadtest.Replica) error {
			defer ps.Restore()
			c, first := dr.enter(ctx, r, atAfterRead, "cut")
			if c == nil {
				return nil
			}
			defer c.Answer()
			d := leaseLife(run)
			what := fmt.Sprintf("latency of %s each way", 2*d)
			var err error
			if blackhole {
				err, what = ps.Cut(), "a blackhole (nothing passes)"
			} else {
				err = ps.Latency(2 * d)
			}
			if err != nil {
				return err
			}
			t0 := time.Now()
			run.Fired("%s holds the lock; its path to the lock server now has %s", c, what)
			// Another holder comes in once the server let the lease go.
			c2, second, err := dr.sendCaught(ctx, next, atBeforeWrite, "second", d+lockWait)
			if err == nil {
				c2.Answer()
				run.Eventf("%s took the same lock %s after the cut, while %s was still inside", c2, since(t0), c.Replica)
			} else {
				run.Eventf("no second holder while the path was cut: %v", err)
			}
			dr.wait(ctx, second, d+lockWait)
			_ = clock.Sleep(ctx, d+d/4+250*time.Millisecond-time.Since(t0))
			ps.Restore()
			if blackhole {
				// Let the client reconnect and learn its session's fate.
				_ = clock.Sleep(ctx, time.Second)
			}
			run.Eventf("path healed after %s; %s goes on and must find its lease lost", since(t0), c.Replica)
			c.Answer()
			dr.wait(ctx, first, faultLimit/2)
			return nil
		},
	}.fault()
}

// since is the time since t0, rounded for a sentence.
func since(t0 time.Time) time.Duration { return time.Since(t0).Round(time.Millisecond) }
