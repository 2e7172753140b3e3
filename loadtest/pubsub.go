package loadtest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// PubSub is what a Redis Cluster's bus carried, per node, for a run on it
// (the claim: "every node receives every PUBLISH"). The figures are the
// nodes' own counters (CLUSTER INFO cluster_stats_messages_publish_received
// and ..._publishshard_received), read by the lab on the run's cluster:
//
//   - Lock*: the bus messages each node received during the run, per lease
//     released (the lock's wake-ups; the cache publishes nothing);
//   - Publish, SPublish: per message of a probe sent after the run from the
//     master of the probe channel's slot, pubsubProbe of each.
type PubSub struct {
	Releases int          `json:"releases"`
	Nodes    []PubSubNode `json:"nodes"`
}

// PubSubNode is one node's figures.
type PubSubNode struct {
	Addr         string  `json:"addr"`
	LockPublish  float64 `json:"lock_publish_per_release"`
	LockSPublish float64 `json:"lock_spublish_per_release"`
	Publish      float64 `json:"publish_per_message"`
	SPublish     float64 `json:"spublish_per_message"`
}

// pubsubProbe is how many PUBLISH and how many SPUBLISH the probe sends.
const pubsubProbe = 50

// busCounts are a node's bus messages received, by type.
type busCounts struct{ publish, shard int64 }

// readBus reads every node's bus counters.
func readBus(ctx context.Context, nodes []string) (map[string]busCounts, error) {
	out := make(map[string]busCounts, len(nodes))
	for _, a := range nodes {
		c := redis.NewClient(&redis.Options{Addr: a})
		info, err := c.ClusterInfo(ctx).Result()
		c.Close()
		if err != nil {
			return nil, fmt.Errorf("cluster info on %s: %w", a, err)
		}
		var b busCounts
		for _, line := range strings.Split(info, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "cluster_stats_messages_publish_received":
				b.publish = n
			case "cluster_stats_messages_publishshard_received":
				b.shard = n
			}
		}
		out[a] = b
	}
	return out, nil
}

// busDelivery is how long the probe waits for the bus, which delivers
// asynchronously, before reading the counters.
const busDelivery = 300 * time.Millisecond

// measurePubSub completes a PubSub from the counters read before the run
// and the run's releases: it reads them again, then sends the probe.
func measurePubSub(ctx context.Context, nodes []string, before map[string]busCounts, releases int) (*PubSub, error) {
	after, err := readBus(ctx, nodes)
	if err != nil {
		return nil, err
	}
	ps := &PubSub{Releases: releases}
	for _, a := range nodes {
		n := PubSubNode{Addr: a}
		if releases > 0 {
			n.LockPublish = round(float64(after[a].publish-before[a].publish) / float64(releases))
			n.LockSPublish = round(float64(after[a].shard-before[a].shard) / float64(releases))
		}
		ps.Nodes = append(ps.Nodes, n)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: nodes})
	defer cc.Close()
	const channel = "oversold:pubsub-probe"
	master, err := cc.MasterForKey(ctx, channel)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	probe := func(send func() error) (map[string]busCounts, map[string]busCounts, error) {
		from, err := readBus(ctx, nodes)
		if err != nil {
			return nil, nil, err
		}
		for range pubsubProbe {
			if err := send(); err != nil {
				return nil, nil, fmt.Errorf("probe: %w", err)
			}
		}
		time.Sleep(busDelivery)
		to, err := readBus(ctx, nodes)
		return from, to, err
	}
	from, to, err := probe(func() error { return master.Publish(ctx, channel, "x").Err() })
	if err != nil {
		return nil, err
	}
	for i, a := range nodes {
		ps.Nodes[i].Publish = round(float64(to[a].publish-from[a].publish) / pubsubProbe)
	}
	if from, to, err = probe(func() error { return master.SPublish(ctx, channel, "x").Err() }); err != nil {
		return nil, err
	}
	for i, a := range nodes {
		ps.Nodes[i].SPublish = round(float64(to[a].shard-from[a].shard) / pubsubProbe)
	}
	return ps, nil
}
