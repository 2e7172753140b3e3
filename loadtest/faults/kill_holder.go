package faults

import (
	"context"
	"fmt"
	"time"

	"github.com/oversold-lab/oversold/loadtest"
)

// KillHolder crashes a replica (SIGKILL) while it holds a lock, inside its
// critical section before the write: the lease stays on the server until it
// expires (TTL, session timeout), so the SKU takes no order until then. The
// run's recovery_ms is that wait: from the kill to the next order decided on
// the SKU by another replica. The client retries nothing: the killed
// replica's request gets a 502 from the balancer, and nothing acknowledged
// may be lost. The killed replica is started again at once, so the load goes
// on with every replica.
func KillHolder() loadtest.Fault {
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
			c, err := nth(ctx, hook, warmup(run), at(atBeforeWrite, r.Name))
			if err != nil {
				eventf(run, "the load ended before %s reached its critical section", r.Name)
				return nil
			}
			t0 := time.Now()
			err = r.Kill()
			c.Answer() // its connection is gone with it
			if err != nil {
				return fmt.Errorf("kill %s: %w", r.Name, err)
			}
			run.Disrupted(c.SKU, t0)
			eventf(run, "%s killed (SIGKILL) holding the lock", c)
			if err := r.Start(ctx); err != nil {
				if ctx.Err() != nil {
					eventf(run, "the load ended before %s was back", r.Name)
					return nil
				}
				return fmt.Errorf("restart %s: %w", r.Name, err)
			}
			eventf(run, "%s started again, ready %s after the kill", r.Name, since(t0))
			return nil
		},
	}
}

// hookPrepare points every replica at a hook of the run's own.
func hookPrepare(runs *perRun[*insideHook]) func(context.Context, *loadtest.Run) (func(), error) {
	return func(ctx context.Context, run *loadtest.Run) (func(), error) {
		hook, err := startInsideHook()
		if err != nil {
			return nil, err
		}
		hookEveryReplica(run, hook)
		runs.put(run, hook)
		return func() { runs.drop(run); hook.Close() }, nil
	}
}
