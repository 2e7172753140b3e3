package loadtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
)

// TestClaimRows: the claims table from runs, cell by cell. A table that
// called a backend safe with an overlap, counted an unfired run as proof,
// took a mean for the median, or mixed single-server runs into the
// cluster's handoff would not give these strings.
func TestClaimRows(t *testing.T) {
	run := func(backend, guard, fault string, safe bool, overlaps int) Result {
		return Result{Backend: backend, Guard: guard, Fault: fault, Safe: safe, Overlaps: overlaps, Topology: "cluster"}
	}
	withHandoff := func(backend, topology string, p50, p99 float64) Result {
		return Result{Backend: backend, Guard: "none", Safe: true, Topology: topology, HandoffMS: &Wait{P50: p50, P99: p99}}
	}
	ps := func(publish, spublish, lock []float64) *PubSub {
		p := &PubSub{Releases: 10}
		for i := range publish {
			p.Nodes = append(p.Nodes, PubSubNode{Publish: publish[i], SPublish: spublish[i], LockPublish: lock[i]})
		}
		return p
	}
	r1 := withHandoff("redis", "cluster", 1, 10)
	r1.PubSub = ps([]float64{0, 1, 1, 1, 1, 1}, []float64{0, 0, 0, 1, 0, 0}, []float64{0.9, 0.9, 0.9, 0.9, 0.9, 0})
	r2 := withHandoff("redis", "cluster", 3, 30)
	r2.PubSub = ps([]float64{1, 1, 0, 1, 1, 1}, []float64{0, 0, 0, 0, 0, 1}, []float64{1, 1, 1, 1, 1, 0})
	unfired := run("etcd", "none", "etcd-leader-kill", true, 0)
	unfired.NotFired = true
	results := []Result{
		run("redis", "none", "redis-cluster-failover", false, 0),
		run("redis", "none", "redis-cluster-failover", false, 1),
		run("redis", "fencing", "redis-cluster-failover", true, 1),
		run("redis", "fencing", "redis-cluster-failover", false, 1),
		r1, r2, withHandoff("redis", "cluster", 2, 20),
		withHandoff("redis", "", 5, 50), // single server
		run("zookeeper", "none", "zk-leader-kill", true, 0),
		run("zookeeper", "none", "zk-leader-kill", true, 0),
		unfired, run("etcd", "none", "etcd-leader-kill", true, 0),
		withHandoff("mysql", "", 1, 2), // no cluster: no row
	}
	rows := ClaimRows(results)
	want := map[string][]string{
		"redis": {
			clusterName["redis"],
			"no, redis-cluster-failover: guard none: lease overlap in 1 of 2 runs, unsafe in 2, fired 2/2; guard fencing safe 1/2",
			"2 / 20 ms (median of 3 runs); single server: 5 / 50 ms",
			"PUBLISH, per message: 1 on 5 nodes, 0 on 1 node;\nSPUBLISH, per message: 1 on 1 node, 0 on 5 nodes;\n" +
				"the lock's own wake-ups, per release (20 releases in 2 runs): 0.95 on 5 nodes, 0 on 1 node by PUBLISH, 0 on 6 nodes by SPUBLISH",
		},
		"zookeeper": {clusterName["zookeeper"], "yes, zk-leader-kill: guard none: lease overlap in 0 of 2 runs, unsafe in 0, fired 2/2", "-", "none: the lock waits on watches, no pub/sub"},
		"etcd":      {clusterName["etcd"], "yes where it fired, etcd-leader-kill: guard none: lease overlap in 0 of 2 runs, unsafe in 0, fired 1/2", "-", "none: the lock waits on watches, no pub/sub"},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d: %+v", len(rows), len(want), rows)
	}
	for _, r := range rows {
		w, ok := want[r.Backend]
		if !ok {
			t.Errorf("a row for %s", r.Backend)
			continue
		}
		for i := range w {
			if r.Cells[i] != w[i] {
				t.Errorf("%s, %s:\n got %q\nwant %q", r.Backend, ClaimHeads[i], r.Cells[i], w[i])
			}
		}
	}
	if rows := ClaimRows([]Result{withHandoff("redis", "", 1, 2)}); rows != nil {
		t.Errorf("rows without a cluster run: %+v", rows)
	}
}

// TestMeasurePubSub reads a real Redis Cluster's bus counters as the lab
// does: PUBLISHes sent "during the run" from the master of their channel's
// slot count once on each other node; the probe finds PUBLISH on every
// node but the sender and SPUBLISH on the shard's replica only.
func TestMeasurePubSub(t *testing.T) {
	nodes := testbed.RedisCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	before, err := readBus(ctx, nodes)
	if err != nil {
		t.Fatal(err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: nodes})
	defer cc.Close()
	channel := "lock:{" + testbed.Prefix(t) + "}:released"
	master, err := cc.MasterForKey(ctx, channel)
	if err != nil {
		t.Fatal(err)
	}
	const releases = 20
	for range releases {
		if err := master.Publish(ctx, channel, "x").Err(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(busDelivery)
	ps, err := measurePubSub(ctx, nodes, before, releases)
	if err != nil {
		t.Fatal(err)
	}
	count := func(get func(PubSubNode) float64) (ones, zeros int) {
		for _, n := range ps.Nodes {
			switch v := get(n); {
			case v >= 0.99 && v <= 1.01:
				ones++
			case v == 0:
				zeros++
			}
		}
		return ones, zeros
	}
	var b strings.Builder
	for _, n := range ps.Nodes {
		b.WriteString("\n  " + n.Addr + ": " + num(n.LockPublish) + " " + num(n.Publish) + " " + num(n.SPublish))
	}
	t.Logf("per node: lock PUBLISH per release, PUBLISH, SPUBLISH per message:%s", b.String())
	if len(ps.Nodes) != 6 || ps.Releases != releases {
		t.Fatalf("%d nodes, %d releases; want 6, %d", len(ps.Nodes), ps.Releases, releases)
	}
	if ones, zeros := count(func(n PubSubNode) float64 { return n.LockPublish }); ones != 5 || zeros != 1 {
		t.Errorf("the run's PUBLISHes: 1 per release on %d nodes, 0 on %d; want 5 and 1 (the sender)", ones, zeros)
	}
	if ones, zeros := count(func(n PubSubNode) float64 { return n.Publish }); ones != 5 || zeros != 1 {
		t.Errorf("PUBLISH probe: 1 per message on %d nodes, 0 on %d; want 5 and 1", ones, zeros)
	}
	if ones, zeros := count(func(n PubSubNode) float64 { return n.SPublish }); ones != 1 || zeros != 5 {
		t.Errorf("SPUBLISH probe: 1 per message on %d nodes, 0 on %d; want 1 (the shard's replica) and 5", ones, zeros)
	}
}
