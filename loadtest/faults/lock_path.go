package faults

import (
	"context"
	"fmt"
	"time"

	"github.com/oversold-lab/oversold/loadtest"
)

// victim is the replica whose paths the network faults disturb: r1. Only it
// gets proxies; the others keep their direct paths, as in a partial
// partition.
const victim = 0

// cut is what a network fault keeps for a run: the hook that catches the
// victim's order, and the proxies on the victim's paths.
type cut struct {
	hook *insideHook
	ps   proxies
}

// prepareCut puts the victim behind proxies on paths and the hook in every
// replica, and returns the cleanup.
func prepareCut(run *loadtest.Run, runs *perRun[cut], paths ...string) (func(), error) {
	var ps proxies
	for _, path := range paths {
		more, err := proxyReplica(run, victim, path)
		if err != nil {
			ps.Close()
			return nil, err
		}
		ps = append(ps, more...)
	}
	hook, err := startInsideHook()
	if err != nil {
		ps.Close()
		return nil, err
	}
	hookEveryReplica(run, hook)
	runs.put(run, cut{hook, ps})
	return func() {
		runs.drop(run)
		hook.Close()
		ps.Close()
	}, nil
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
	var runs perRun[cut]
	return loadtest.Fault{
		Backends: backends,
		Prepare: func(ctx context.Context, run *loadtest.Run) (func(), error) {
			return prepareCut(run, &runs, pathLock)
		},
		Inject: func(ctx context.Context, run *loadtest.Run) error {
			st, err := runs.get(run)
			if err != nil {
				return err
			}
			defer st.ps.heal()
			r, err := replica(run, victim)
			if err != nil {
				return err
			}
			next, err := replica(run, victim+1)
			if err != nil {
				return err
			}
			ctx, cancel := detach(ctx)
			defer cancel()
			dr := newDriver(run)
			defer dr.close()
			caught := st.hook.expect(byKey(atAfterRead, run.KeyPrefix+"-cut"))
			first := dr.send(ctx, r, "cut")
			c, err := catch(ctx, caught, first, 2*lockWait)
			if err != nil {
				notFired(run, err)
				dr.wait(ctx, first, lockWait)
				return nil
			}
			defer c.Answer()
			d := leaseLife(run)
			what := fmt.Sprintf("latency of %s each way", 2*d)
			if blackhole {
				err, what = st.ps.blackhole(), "a blackhole (nothing passes)"
			} else {
				err = st.ps.latency(2 * d)
			}
			if err != nil {
				return err
			}
			t0 := time.Now()
			run.Fired("%s holds the lock; its path to the lock server now has %s", c, what)
			// Another holder comes in once the server let the lease go.
			seen := st.hook.expect(byKey(atBeforeWrite, run.KeyPrefix+"-second"))
			second := dr.send(ctx, next, "second")
			if c2, err := catch(ctx, seen, second, d+lockWait); err == nil {
				c2.Answer()
				run.Eventf("%s took the same lock %s after the cut, while %s was still inside", c2, since(t0), c.Replica)
			} else {
				run.Eventf("no second holder while the path was cut: %v", err)
			}
			dr.wait(ctx, second, d+lockWait)
			_ = sleepCtx(ctx, d+d/4+250*time.Millisecond-time.Since(t0))
			st.ps.heal()
			if blackhole {
				// Let the client reconnect and learn its session's fate.
				_ = sleepCtx(ctx, time.Second)
			}
			run.Eventf("path healed after %s; %s goes on and must find its lease lost", since(t0), c.Replica)
			c.Answer()
			dr.wait(ctx, first, faultLimit/2)
			return nil
		},
	}
}

// warmup is how many orders to let through before a fault strikes, drawn
// from the run's seed: a few, so MySQL already holds a fence and a version.
func warmup(run *loadtest.Run) int { return 2 + run.Rand.IntN(4) }

// nth returns the n-th call match accepts, answering the ones before it.
func nth(ctx context.Context, h *insideHook, n int, match func(*hookCall) bool) (*hookCall, error) {
	for i := 1; ; i++ {
		c, err := h.next(ctx, match)
		if err != nil || i >= n {
			return c, err
		}
		c.Answer()
	}
}

// victimCall lets the run's first few orders through (warmup, from any
// replica), then returns the next order of replica (any when "") inside its
// critical section, before its write. When the load ends first it says so
// in the run's events and returns the ctx error.
func victimCall(ctx context.Context, run *loadtest.Run, h *insideHook, replica string) (*hookCall, error) {
	c, err := nth(ctx, h, warmup(run), at(atBeforeWrite, ""))
	if err == nil {
		c.Answer()
		c, err = h.next(ctx, at(atBeforeWrite, replica))
	}
	if err != nil {
		who := replica
		if who == "" {
			who = "any replica"
		}
		run.Eventf("the load ended before %s held a lock after the warm-up: nothing injected", who)
		return nil, err
	}
	return c, nil
}

// since is the time since t0, rounded for a sentence.
func since(t0 time.Time) time.Duration { return time.Since(t0).Round(time.Millisecond) }
