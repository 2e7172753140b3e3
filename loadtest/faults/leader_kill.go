package faults

import (
	"context"
	"fmt"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// ZKLeaderKill kills the leader of a three-node ZooKeeper ensemble with
// SIGKILL while a replica holds a lock and orders flow. The two followers
// elect a new leader, which takes over every session with its full timeout,
// so the holder's session, and its ephemeral node, survive: a rival waits
// for the holder's release, no second holder ever overlaps it, and even
// guard none keeps every invariant. The run's recovery_ms is the longer of
// the election (kill to a new leader) and the load's wait for its next
// decided order.
func ZKLeaderKill() loadtest.Fault {
	return leaderKill("zookeeper", func(ctx context.Context) (*testbed.Cluster, error) {
		return testbed.StartZooKeeperEnsemble(ctx, testbed.ClusterOptions{}, nil)
	})
}

// EtcdLeaderKill is the etcd analogue: the leader of a three-member cluster
// killed under a held lease. The new leader keeps every lease (Raft
// replicated it; etcd extends leases on a leader change so none expires
// for the election's sake).
func EtcdLeaderKill() loadtest.Fault {
	return leaderKill("etcd", func(ctx context.Context) (*testbed.Cluster, error) {
		return testbed.StartEtcdCluster(ctx, testbed.ClusterOptions{})
	})
}

// leaderKillTTL is the shortest lock TTL the leader-kill scenarios run
// with. The holder's lease must outlive the election and its client's move
// to another server: its Lost closes when no renewal succeeded for the TTL
// (counted from the last renewal, up to TTL/3 before the kill). On this
// 2-core machine shared with other work an election and the move took up
// to 1.7 s, more than a 2 s lease has left; production leases are 10 s and
// more (etcd's concurrency sessions default to 60 s).
const leaderKillTTL = 3 * time.Second

// leaderKill is a leader-kill scenario on backend's cluster, which every
// run gets to itself (a killed leader must not disturb the next run): the
// lab's --topology cluster servers are left alone.
func leaderKill(backend string, startCluster func(context.Context) (*testbed.Cluster, error)) loadtest.Fault {
	type state struct {
		cluster *testbed.Cluster
		life    time.Duration // the replicas' lease life
	}
	return scenario[state]{
		Backends: []string{backend},
		Prepare: func(ctx context.Context, run *loadtest.Run) (state, func(), error) {
			c, err := startCluster(ctx)
			if err != nil {
				return state{}, nil, err
			}
			if backend == "zookeeper" {
				run.Servers.ZKServers = c.Addrs()
			} else {
				run.Servers.EtcdEndpoints = c.Addrs()
			}
			life := leaseLife(run)
			if t := ttl(run); t < leaderKillTTL {
				for _, env := range run.ReplicaEnv {
					env["OVERSOLD_LOCK_TTL"] = leaderKillTTL.String()
				}
				run.Eventf("lock TTL raised from %s to %s for this scenario: the lease must outlive the election and the client's move to another server", t, leaderKillTTL)
				life += leaderKillTTL - t
			}
			return state{c, life}, func() { c.Stop() }, nil
		},
		Inject: func(ctx context.Context, run *loadtest.Run, d *driver, st state, r, next *loadtest.Replica) error {
			c, first := d.enter(ctx, r, atBeforeWrite, "held")
			if c == nil {
				return nil
			}
			defer c.Answer()
			// Asked until a node answers that it leads: a busy JVM may let
			// one srvr time out.
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			leader, err := st.cluster.WaitLeader(lctx, -1)
			cancel()
			if err != nil {
				return err
			}
			// The rival is caught at the same point, once it holds the lock.
			rival := d.hook.expect(byKey(atBeforeWrite, run.KeyPrefix+"-rival"))
			t0 := time.Now()
			if err := st.cluster.Nodes[leader].Kill(); err != nil {
				return err
			}
			run.Disrupted("", t0)
			run.Fired("%s holds the lock; the %s leader, node %d of 3 (%s), killed (SIGKILL)", c, backend, leader+1, st.cluster.Nodes[leader].Addr)
			ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
			now, err := st.cluster.WaitLeader(ectx, leader)
			cancel()
			if err != nil {
				run.Eventf("no new leader: %v", err)
			} else {
				run.Recovered(time.Since(t0))
				run.Eventf("node %d leads %s after the kill", now+1, since(t0))
			}
			// The rival asks once the ensemble serves again, and the holder
			// stays inside for the lease's whole life after that: had the
			// failover lost the lease, the new leader would have expired it
			// and granted the rival by then.
			t1 := time.Now()
			second := d.send(ctx, next, "rival")
			hold := st.life + 500*time.Millisecond
			select {
			case c2 := <-rival:
				run.Eventf("%s took the same lock %s after the kill, while %s still held it: two holders", c2, since(t0), c.Replica)
				c2.Answer()
			case <-time.After(hold):
				run.Eventf("no rival got the lock in the %s %s held it after the election", since(t1), c.Replica)
			case <-ctx.Done():
			}
			c.Answer()
			d.wait(ctx, first, lockWait)
			select { // the rival now gets the lock the holder released
			case c2 := <-rival:
				c2.Answer()
			case <-time.After(2 * lockWait):
			case <-ctx.Done():
			}
			d.wait(ctx, second, lockWait)

			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := st.cluster.Nodes[leader].Restart(rctx); err != nil {
				return fmt.Errorf("restart the killed leader: %w", err)
			}
			run.Eventf("node %d restarted and rejoined %s after the kill", leader+1, since(t0))
			return nil
		},
	}.fault()
}
