package faults

import (
	"context"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// RedisRestart kills the lock's Redis with SIGKILL while a replica holds a
// lease, and starts it again at once on the same port without persistence
// (no RDB, no AOF), as a crashed cache node comes back empty. The run gets a
// private Redis, so the lab's shared one is never disturbed; it also holds
// the stock cache (one setting), which comes back empty and refills from
// MySQL.
//
// The restarted Redis has forgotten the lock, so another replica takes it
// while the first holder is still inside: two holders, until the first one's
// next renewal finds its key gone (at most TTL/3). It has forgotten the
// fencing counter as well: tokens start again from 1, below the fence MySQL
// keeps, so under guard fencing the new holders are refused (409 lock_lost)
// until the counter climbs past it: safe, but not available.
func RedisRestart() loadtest.Fault {
	return scenario[*testbed.Server]{
		// none: the stock gate's Redis (--gates redis), the cache's alone
		// without it.
		Backends: []string{"redis", "none"},
		Prepare: func(ctx context.Context, run *loadtest.Run) (*testbed.Server, func(), error) {
			srv, err := testbed.StartRedis(ctx, testbed.Options{})
			if err != nil {
				return nil, nil, err
			}
			run.Servers.RedisAddr = srv.Addr
			return srv, func() { srv.Stop() }, nil
		},
		Inject: func(ctx context.Context, run *loadtest.Run, d *driver, srv *testbed.Server, r, next *loadtest.Replica) error {
			c, first := d.enter(ctx, r, atBeforeWrite, "held")
			if c == nil {
				return nil
			}
			defer c.Answer()
			t0 := time.Now()
			if err := srv.Kill(); err != nil {
				return err
			}
			// Restart on a context of its own: the server must come back
			// even if the load ends meanwhile.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			err := srv.Restart(rctx)
			cancel()
			if err != nil {
				return err
			}
			run.Disrupted("", t0)
			what := "holds the lock"
			if run.Spec.Backend == "none" {
				what = "is inside its flow (no lock; the gate's take and the cache read done)"
			}
			run.Fired("%s %s; Redis killed (SIGKILL) and restarted empty in %s", c, what, since(t0))
			racePair(ctx, d, c, next, ttl(run)/3+lockWait)
			d.wait(ctx, first, faultLimit/2)
			return nil
		},
	}.fault()
}

// racePair sends a second order to replica next on the fault SKU while
// first holds its lock at the hook before the write, waits up to limit for
// it to be let into the same lock, then lets both go on together, as two
// holders who each read the stock before either wrote: without a guard,
// one decrement is lost. It answers first in any case, and waits for the
// second order's answer.
func racePair(ctx context.Context, d *driver, first *hookCall, next *loadtest.Replica, limit time.Duration) {
	defer first.Answer()
	run := d.run
	t0 := time.Now()
	c2, second, err := d.sendCaught(ctx, next, atBeforeWrite, "second", limit)
	if err != nil {
		run.Eventf("no second holder of %s: %v", first.SKU, err)
	} else {
		if run.Spec.Backend == "none" {
			run.Eventf("%s is inside its flow on the same SKU %s later; both go on", c2, since(t0))
		} else {
			run.Eventf("%s holds the same lock %s later: two holders; both go on", c2, since(t0))
		}
		c2.Answer()
	}
	first.Answer()
	d.wait(ctx, second, limit+lockWait)
}
