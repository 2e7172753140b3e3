package faults

import (
	"context"
	"time"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// DelayedWrite is Kleppmann's delayed packet ("How to do distributed
// locking", 2016): the holder sends its write while its lease is valid, and
// the write reaches MariaDB after the lease expired and a second holder
// wrote. The fault drives the orders itself, on the run's fault SKU: r1's
// (only r1 has proxies) is caught at the hook before the write, right after
// the flow's one Lost check; its network then turns slow: a latency of one
// lease life each way on its path to MariaDB and on its path to the lock
// server (the same path for backend mysql), and it sends its write. Its
// renewals time out, the lease ends, r2 takes the lock and writes; the path
// heals once that second write is done, and the first write lands on top of
// it. Guard none: the late write overwrites the second one (a lost update);
// fencing and version refuse it (stale writes refused). No check in the
// flow can stop it: the write was already on its way when the lease ended.
func DelayedWrite() loadtest.Fault {
	return scenario[testbed.Proxies]{
		Backends: []string{"redis", "redlock", "zookeeper", "mysql", "etcd"},
		Prepare: func(ctx context.Context, run *loadtest.Run) (testbed.Proxies, func(), error) {
			paths := []string{pathMySQL}
			if run.Spec.Backend != "mysql" { // for mysql the lock path is MariaDB already
				paths = append(paths, pathLock)
			}
			return prepareCut(run, paths...)
		},
		Replicas: victimPair,
		Inject: func(ctx context.Context, run *loadtest.Run, dr *driver, ps testbed.Proxies, r, next *loadtest.Replica) error {
			defer ps.Restore()
			c, first := dr.enter(ctx, r, atBeforeWrite, "delayed")
			if c == nil {
				return nil
			}
			defer c.Answer()
			d := leaseLife(run)
			if err := ps.Latency(d); err != nil {
				return err
			}
			t0 := time.Now()
			c.Answer()
			run.Fired("%s read the stock under its lease and passed its Lost check; its paths to MariaDB and to the lock server now have %s latency each way, and it sends its write", c, d)
			// The late write should land after a second holder's write:
			// heal a moment after the second holder committed.
			c2, second, err := dr.sendCaught(ctx, next, atBeforeWrite, "second", d+lockWait)
			if err == nil {
				c2.Answer()
				run.Eventf("%s took the same lock %s later and writes", c2, since(t0))
			} else {
				run.Eventf("no second holder: %v", err)
			}
			dr.wait(ctx, second, d+lockWait)
			_ = clock.Sleep(ctx, 300*time.Millisecond)
			ps.Restore()
			run.Eventf("paths healed after %s: %s's delayed write reaches MariaDB now", since(t0), c.Replica)
			dr.wait(ctx, first, faultLimit/2)
			return nil
		},
	}.fault()
}
