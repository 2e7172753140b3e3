package faults

import (
	"context"
	"fmt"
	"time"

	"github.com/oversold-lab/oversold/loadtest"
)

// DelayedWrite is Kleppmann's delayed packet ("How to do distributed
// locking", 2016): the holder sends its write while its lease is valid, and
// the write reaches MariaDB after the lease expired and a second holder
// wrote. Right after a replica has read the stock under its lease, its
// network turns slow: a latency of one TTL each way on its path to MariaDB
// and on its path to the lock server (the same path for backend mysql). Its
// renewals time out, the lease ends, another replica takes the lock and
// writes; the path heals once that second write is done, and the first
// write lands on top of it.
//
// Two checks stand in the way. The guards: version and fencing refuse the
// late write (counted as stale writes refused). And the flow's own Lost
// check right before COMMIT: under guard none the late UPDATE does apply,
// but the transaction then finds the lease lost and rolls back. A write can
// only get through if the delay strikes after that last check, with COMMIT
// itself in flight.
func DelayedWrite() loadtest.Fault {
	type state struct {
		hook *insideHook
		ps   proxies
	}
	var runs perRun[state]
	return loadtest.Fault{
		Backends: []string{"redis", "redlock", "zookeeper", "mysql", "etcd"},
		Prepare: func(ctx context.Context, run *loadtest.Run) (func(), error) {
			ps, err := proxyReplica(run, victim, pathMySQL)
			if err != nil {
				return nil, err
			}
			if run.Spec.Backend != "mysql" {
				lock, err := proxyReplica(run, victim, pathLock)
				if err != nil {
					ps.Close()
					return nil, err
				}
				ps = append(ps, lock...)
			}
			hook, err := startInsideHook()
			if err != nil {
				ps.Close()
				return nil, err
			}
			hookEveryReplica(run, hook)
			runs.put(run, state{hook, ps})
			return func() {
				runs.drop(run)
				hook.Close()
				ps.Close()
			}, nil
		},
		Inject: func(ctx context.Context, run *loadtest.Run) error {
			st, err := runs.get(run)
			if err != nil {
				return err
			}
			defer st.ps.heal()
			name := fmt.Sprintf("r%d", victim+1)
			c, err := victimCall(ctx, run, st.hook, name)
			if err != nil {
				return nil
			}
			d := leaseLife(run)
			if err := st.ps.latency(d); err != nil {
				c.Answer()
				return err
			}
			t0 := time.Now()
			c.Answer()
			run.Eventf("%s read the stock under its lease; its paths to MariaDB and to the lock server now have %s latency each way, and it sends its write", c, d)
			// The late write should land after a second holder's write:
			// heal a moment after the second holder went on, or after
			// three TTLs without one.
			limit := 3 * d
			wait, cancel := context.WithTimeout(ctx, limit)
			c2, err := st.hook.next(wait, secondHolder(c))
			cancel()
			if err == nil {
				c2.Answer()
				run.Eventf("%s took the same lock %s later and writes", c2, since(t0))
				_ = sleepCtx(ctx, 300*time.Millisecond)
			} else if ctx.Err() == nil {
				run.Eventf("no second holder within %s", limit)
			}
			st.ps.heal()
			run.Eventf("paths healed after %s: %s's delayed write reaches MariaDB now", since(t0), c.Replica)
			return nil
		},
	}
}
