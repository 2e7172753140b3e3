package faults

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/oversold-lab/oversold/loadtest"
)

// KillHolder crashes a replica (SIGKILL) while it holds a lock, inside its
// critical section before the write: the lease stays on the server until it
// expires (TTL, session timeout), so the SKU takes no order until then. The
// fault drives the orders itself, on the run's fault SKU: a batch on the
// struck replica (the seed draws it; enterBatch), killed at the hook before
// the write, then
// one to the next replica at once, which waits for the dead holder's lease.
// The run's recovery_ms is that wait: from the kill to the second order's
// answer. Nothing is retried: the killed orders get no answer, and nothing
// acknowledged may be lost. The killed replica is started again, so the
// load goes on with every replica.
//
// Under lock none the replica dies inside its flow before the write: with
// the stock gate, between its take and its commit, so the gate withholds
// the take until a back-check gives it back.
func KillHolder() loadtest.Fault {
	f := drivenFault(func(ctx context.Context, run *loadtest.Run, d *driver, r, next *loadtest.Replica) error {
		c, first, _ := d.enterBatch(ctx, r, atBeforeWrite, "killed")
		if c == nil {
			return nil
		}
		t0 := time.Now()
		err := r.Kill()
		c.Answer() // its connection is gone with it
		if err != nil {
			return fmt.Errorf("kill %s: %w", r.Name, err)
		}
		switch {
		case run.Spec.Backend != "none":
			run.Fired("%s killed (SIGKILL) holding the lock", c)
		case run.Spec.Gate != "":
			run.Fired("%s killed (SIGKILL) between its gate take and its write", c)
		default:
			run.Fired("%s killed (SIGKILL) before its write", c)
		}
		second := d.send(ctx, next, "after-kill")
		if p := d.wait(ctx, second, leaseLife(run)+2*lockWait); p.status == http.StatusCreated {
			run.Recovered(time.Since(t0))
			if run.Spec.Backend == "none" {
				run.Eventf("%s placed its order %s after the kill", next.Name, since(t0))
			} else {
				run.Eventf("%s took the dead holder's lock and placed its order %s after the kill", next.Name, since(t0))
			}
		}
		d.wait(ctx, first, lockWait)
		if err := r.Start(ctx); err != nil {
			return fmt.Errorf("restart %s: %w", r.Name, err)
		}
		run.Eventf("%s started again, ready %s after the kill", r.Name, since(t0))
		return nil
	})
	f.Backends = append(slices.Clone(leaseBackends), "none")
	return f
}
