package faults

import (
	"context"
	"fmt"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// RedisClusterFailover is RedisFailover on a Redis Cluster: the run gets a
// private cluster of three masters with a replica each, whose replicas
// replicate as the ACL user repl. The fault finds the master of the fault
// SKU's lock slot ({sku/...}: the lock, its fence counter and its queue
// live there) and its replica, cuts that replication link by its user,
// takes the lock on the master only, and kills the master. The cluster's
// failure detector and vote promote the replica after cluster-node-timeout
// (replicas may fail over whatever their lag:
// cluster-replica-validity-factor 0, else a replica cut off for long would
// refuse, and the slot would stay down), and a second holder takes the same
// lock there: two holders, as with Sentinel. Redis Cluster's own
// documentation says so: it "is not able to guarantee strong consistency",
// and acknowledged writes are lost when a master fails before replicating.
// Guard none loses an update; fencing and version refuse the stale write.
func RedisClusterFailover() loadtest.Fault {
	return failoverFault(startClusterFailover, []string{"redis"})
}

func startClusterFailover(ctx context.Context) (*failover, error) {
	c, err := testbed.StartRedisCluster(ctx, testbed.ClusterOptions{Args: []string{
		"--user", replUser, "on", ">" + replPass, "~*", "&*", "+@all",
		"--masteruser", replUser, "--masterauth", replPass,
	}})
	if err != nil {
		return nil, err
	}
	return &failover{cluster: c}, nil
}

// pickSlot sets the master that serves key's slot now, and its replica.
func (f *failover) pickSlot(ctx context.Context, run *loadtest.Run, key string) error {
	slot, err := f.cluster.KeySlot(ctx, key)
	if err != nil {
		return err
	}
	m, err := f.cluster.MasterOf(ctx, slot)
	if err != nil {
		return err
	}
	reps, err := f.cluster.ReplicasOf(ctx, m)
	if err != nil {
		return err
	}
	if len(reps) != 1 {
		return fmt.Errorf("redis cluster: the master of slot %d has %d replicas, want 1", slot, len(reps))
	}
	f.master, f.replica = f.cluster.Nodes[m], f.cluster.Nodes[reps[0]]
	run.Eventf("%s lives in slot %d, on master %s (node %d of 6) replicated by %s (node %d)", key, slot, f.master.Addr, m+1, f.replica.Addr, reps[0]+1)
	return nil
}

// clusterPromoted: the replica says it is a master (it won the vote; the
// other nodes learn it by gossip, and clients by a MOVED reply).
func clusterPromoted(ctx context.Context, f *failover) error {
	i := index(f.cluster.Nodes, f.replica)
	if role, err := f.cluster.Role(ctx, i); err != nil || role != "master" {
		return fmt.Errorf("replica role %q (%v)", role, err)
	}
	return nil
}

func index(nodes []*testbed.Server, s *testbed.Server) int {
	for i, n := range nodes {
		if n == s {
			return i
		}
	}
	return -1
}
