package faults

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// ZKFollowerPartition cuts the lock holder's ZooKeeper server, a follower,
// off from the rest of the ensemble while it still answers the holder. The
// run gets a three-node ensemble of its own whose peer links (quorum and
// election ports) each go through a proxy, and the victim replica (r1)
// talks to one follower only; the others talk to the leader and the other
// follower.
//
// Once the load is over, r1 takes the lock and is held at the hook after its read, before its
// Lost check. The fault blackholes every peer link of r1's follower. That
// follower keeps serving r1's reads from its own copy (it gives up on the
// leader only after syncLimit, 5 s), but it no longer forwards r1's session
// pings: the leader expires the session after the session timeout, deletes
// r1's node and grants the lock to r2. A liveness check that only reads
// (Exists on the follower) keeps succeeding, so r1 would find its lease
// alive and write beside r2: two holders. zklock's check syncs through the
// leader first, which the cut follower cannot do: the checks fail, and Lost
// closes when the last confirmed check's validity runs out, before the
// leader can expire the session and grant r2 the lock. r1 finds its lease
// lost and writes nothing: even guard none is safe.
func ZKFollowerPartition() loadtest.Fault {
	type state struct {
		cluster  *testbed.Cluster
		follower int                     // the victim's server
		links    map[int]testbed.Proxies // by node: every proxy on a link to or from it
	}
	return scenario[*state]{
		Backends: []string{"zookeeper"},
		Prepare: func(ctx context.Context, run *loadtest.Run) (_ *state, _ func(), err error) {
			st := &state{links: map[int]testbed.Proxies{}}
			var (
				mu  sync.Mutex // peer is called from every node's start at once
				all testbed.Proxies
			)
			defer func() {
				if err != nil {
					all.Close()
				}
			}()
			peer := func(from, to, port int) (int, error) {
				p, err := testbed.StartProxy(fmt.Sprintf("zk%d-zk%d-%d", from+1, to+1, port), net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
				if err != nil {
					return 0, err
				}
				mu.Lock()
				all = append(all, p)
				st.links[from] = append(st.links[from], p)
				st.links[to] = append(st.links[to], p)
				mu.Unlock()
				_, ps, _ := net.SplitHostPort(p.Addr())
				return strconv.Atoi(ps)
			}
			c, err := testbed.StartZooKeeperEnsemble(ctx, testbed.ClusterOptions{}, peer)
			if err != nil {
				return nil, nil, err
			}
			leader, err := c.Leader(ctx)
			if err != nil {
				c.Stop()
				return nil, nil, err
			}
			st.cluster = c
			var others []string
			st.follower = followerOf(leader, run.Rand.IntN(2))
			for i, n := range c.Nodes {
				if i != st.follower {
					others = append(others, n.Addr)
				}
			}
			run.Servers.ZKServers = others
			run.ReplicaEnv[victim]["OVERSOLD_ZK_SERVERS"] = c.Nodes[st.follower].Addr
			return st, func() {
				all.Close()
				c.Stop()
			}, nil
		},
		Replicas: victimPair,
		// After the load: a write of r1's session queued behind the cut
		// (a load order's lock node) would hold back the session's later
		// reads, which ZooKeeper serves in order, and fail the check
		// anyway. An idle holder is the case that needs the sync.
		AfterLoad: true,
		Inject: func(ctx context.Context, run *loadtest.Run, d *driver, st *state, r, next *loadtest.Replica) error {
			links := st.links[st.follower]
			defer links.Restore()
			c, first := d.enter(ctx, r, atAfterRead, "cut")
			if c == nil {
				return nil
			}
			defer c.Answer()
			f := st.cluster.Nodes[st.follower]
			if mode, err := testbed.ZKMode(ctx, f.Addr); err != nil || mode != "follower" {
				notFired(run, fmt.Errorf("%s's server %s is no follower now (%q, %v)", r.Name, f.Addr, mode, err))
				return nil
			}
			if err := links.Cut(); err != nil {
				return err
			}
			t0 := time.Now()
			run.Fired("%s holds the lock through follower %s (node %d of 3); every peer link of that follower now blackholed: it still answers %s, the quorum no longer hears it", c, f.Addr, st.follower+1, r.Name)

			// The leader expires r1's session and grants the rival the lock.
			d0 := leaseLife(run)
			c2, second, err := d.sendCaught(ctx, next, atBeforeWrite, "rival", d0+2*lockWait)
			if err != nil {
				run.Eventf("no rival got the lock while the follower was cut off: %v", err)
			} else {
				run.Eventf("%s took the same lock %s after the cut: the leader expired %s's session", c2, since(t0), c.Replica)
				c2.Answer()
			}
			d.wait(ctx, second, d0+lockWait)
			// r1 goes on while its follower is still cut off, and must find
			// its lease lost at its Lost check.
			c.Answer()
			p := d.wait(ctx, first, faultLimit/2)
			if p.status == 409 && p.code == "lock_lost" {
				run.Eventf("%s found its lease lost and wrote nothing", c.Replica)
			}
			links.Restore()
			run.Eventf("follower's links healed %s after the cut", since(t0))
			return nil
		},
	}.fault()
}

// followerOf is the pick-th (0 or 1) node of three that is not leader.
func followerOf(leader, pick int) int {
	var fs []int
	for i := range 3 {
		if i != leader {
			fs = append(fs, i)
		}
	}
	return fs[pick]
}
