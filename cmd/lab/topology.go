package main

import (
	"context"
	"strings"

	"github.com/oversold-lab/oversold/internal/testbed"
)

// Topologies, as --topology names them.
const (
	topologySingle  = "single"
	topologyCluster = "cluster"
)

// clustered is whether the lab starts kind as a cluster under topology:
// Redis (cache and redis lock), ZooKeeper and etcd do; MySQL and Redlock's
// independent masters do not.
func clustered(topology, kind string) bool {
	return topology == topologyCluster && (kind == kindRedis || kind == kindZK || kind == kindEtcd)
}

// startCluster starts the cluster of kind and returns the addresses
// replicas are given: the Redis Cluster's nodes as one comma-separated
// item (OVERSOLD_REDIS_ADDR's cluster form), the others as a list.
func startCluster(ctx context.Context, kind string, keep bool) ([]string, *testbed.Cluster, error) {
	o := testbed.ClusterOptions{Detach: keep}
	var (
		c   *testbed.Cluster
		err error
	)
	switch kind {
	case kindRedis:
		c, err = testbed.StartRedisCluster(ctx, o)
	case kindZK:
		c, err = testbed.StartZooKeeperEnsemble(ctx, o, nil)
	case kindEtcd:
		c, err = testbed.StartEtcdCluster(ctx, o)
	}
	if err != nil {
		return nil, nil, err
	}
	if kind == kindRedis {
		return []string{strings.Join(c.Addrs(), ",")}, c, nil
	}
	return c.Addrs(), c, nil
}
