package faults

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// redlockNodes is how many private Redis masters the scenario runs Redlock
// on: the smallest N where one node's vote decides a majority.
const redlockNodes = 3

// RedlockNodeRestart is Kleppmann's Redlock counterexample ("How to do
// distributed locking", 2016; antirez's reply "Is Redlock safe?" agrees and
// prescribes delayed restarts): replica r1 cannot reach node C (its
// connections there are refused: a partial partition), so its leases live on
// nodes A and B only, a bare majority. While r1 holds one, node B is killed
// (SIGKILL) and restarted at once without persistence: B has forgotten the
// key, and another replica assembles a second majority from B and C while
// r1 still holds its lease. Redlock has no fencing token, so only guard
// version can save the stock.
func RedlockNodeRestart() loadtest.Fault { return redlockRestart(0) }

// RedlockNodeRestartDelayed is the control: the same, but node B stays
// down for longer than the TTL before it restarts (antirez's delayed
// restart). No second majority can form while r1 may still hold its lease:
// r1's renewals reach only node A, it finds its lease lost, and aborts.
func RedlockNodeRestartDelayed() loadtest.Fault { return redlockRestart(-1) }

// redlockRestart restarts node B after down; a negative down means one TTL
// and a quarter.
func redlockRestart(down time.Duration) loadtest.Fault {
	type state struct {
		nodes []*testbed.Server
		cut   *testbed.Proxy
	}
	return scenario[state]{
		Backends: []string{"redlock"},
		Prepare: func(ctx context.Context, run *loadtest.Run) (state, func(), error) {
			nodes := make([]*testbed.Server, redlockNodes)
			errs := make([]error, redlockNodes)
			var wg sync.WaitGroup
			for i := range nodes {
				wg.Go(func() { nodes[i], errs[i] = testbed.StartRedis(ctx, testbed.Options{}) })
			}
			wg.Wait()
			stop := func() {
				for _, n := range nodes {
					if n != nil {
						n.Stop()
					}
				}
			}
			if err := errors.Join(errs...); err != nil {
				stop()
				return state{}, nil, err
			}
			addrs := make([]string, len(nodes))
			for i, n := range nodes {
				addrs[i] = n.Addr
			}
			run.Servers.RedlockAddrs = addrs
			// r1 reaches node C only through a proxy, which is down: its
			// connections there are refused.
			cut, err := testbed.StartProxy("r1-redlock-c", nodes[2].Addr)
			if err != nil {
				stop()
				return state{}, nil, err
			}
			cut.Refuse()
			r1 := fmt.Sprintf("%s,%s,%s", addrs[0], addrs[1], cut.Addr())
			run.ReplicaEnv[victim]["OVERSOLD_REDLOCK_ADDRS"] = r1
			return state{nodes, cut}, func() {
				cut.Close()
				stop()
			}, nil
		},
		Replicas: victimPair,
		Inject: func(ctx context.Context, run *loadtest.Run, dr *driver, st state, r, next *loadtest.Replica) error {
			run.Eventf("r1 cannot reach Redlock node C: its leases live on nodes A and B only")
			// The immediate restart lets r1 go on past its Lost check, as a
			// holder that does not know; the control holds it before the
			// check, which must find its lease lost.
			point := atBeforeWrite
			if down != 0 {
				point = atAfterRead
			}
			c, first := dr.enter(ctx, r, point, "held")
			if c == nil {
				return nil
			}
			defer c.Answer()
			b := st.nodes[1]
			d := down
			if d < 0 {
				d = ttl(run) + ttl(run)/4
			}
			t0 := time.Now()
			if err := b.Kill(); err != nil {
				return err
			}
			// Restart on a context of its own: the node must come back
			// even if the load ends meanwhile.
			restart := func() error {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				defer cancel()
				return b.Restart(rctx)
			}
			if d == 0 {
				if err := restart(); err != nil {
					return err
				}
				run.Fired("%s holds the lock; node B killed (SIGKILL) and restarted empty in %s", c, since(t0))
				racePair(ctx, dr, c, next, ttl(run)+lockWait)
				dr.wait(ctx, first, faultLimit/2)
				return nil
			}
			run.Fired("%s holds the lock; node B killed (SIGKILL), to restart after %s", c, d)
			seen := dr.hook.expect(byKey(atBeforeWrite, run.KeyPrefix+"-second"))
			second := dr.send(ctx, next, "second")
			_ = clock.Sleep(ctx, d-time.Since(t0))
			if err := restart(); err != nil {
				return err
			}
			run.Eventf("node B restarted empty after %s", since(t0))
			if c2, err := catch(ctx, seen, second, ttl(run)+lockWait); err == nil {
				c2.Answer()
				run.Eventf("%s took the same lock %s after the kill", c2, since(t0))
			} else {
				run.Eventf("no second holder: %v", err)
			}
			dr.wait(ctx, second, ttl(run)+lockWait)
			run.Eventf("%s goes on and must find its lease lost", c.Replica)
			c.Answer()
			dr.wait(ctx, first, faultLimit/2)
			return nil
		},
	}.fault()
}
