package testbed_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
)

// killLeader kills the cluster's leader, waits for another node to lead,
// restarts the old one and returns the indexes.
func killLeader(t *testing.T, c *testbed.Cluster) (old, now int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	old, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Nodes[old].Kill(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if now, err = c.WaitLeader(ctx, old); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: node %d killed, node %d leads %v later", c.Kind, old, now, time.Since(t0).Round(time.Millisecond))
	if err := c.Nodes[old].Restart(ctx); err != nil {
		t.Fatal(err)
	}
	return old, now
}

func TestZooKeeperEnsembleSurvivesLeaderKill(t *testing.T) {
	t.Parallel()
	need(t, testbed.KindZooKeeper)
	c, err := testbed.StartZooKeeperEnsemble(t.Context(), testbed.ClusterOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	conn, _, err := zk.Connect(c.Addrs(), 4*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Create("/before", []byte("x"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	old, _ := killLeader(t, c)
	// The data survives the leader, and the old leader rejoins as a follower.
	if _, err := conn.Create("/after", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if got, _, err := conn.Get("/before"); err != nil || string(got) != "x" {
		t.Fatalf("get /before after the leader kill = %q, %v", got, err)
	}
	if mode, err := testbed.ZKMode(t.Context(), c.Nodes[old].Addr); err != nil || mode != "follower" {
		t.Fatalf("restarted old leader: mode %q, %v; want follower", mode, err)
	}
}

func TestEtcdClusterSurvivesLeaderKill(t *testing.T) {
	t.Parallel()
	need(t, testbed.KindEtcd)
	c, err := testbed.StartEtcdCluster(t.Context(), testbed.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	cl, err := clientv3.New(clientv3.Config{Endpoints: c.Addrs(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := cl.Put(ctx, "before", "x"); err != nil {
		t.Fatal(err)
	}
	killLeader(t, c)
	if _, err := cl.Put(ctx, "after", "y"); err != nil {
		t.Fatal(err)
	}
	resp, err := cl.Get(ctx, "before")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "x" {
		t.Fatalf("get before after the leader kill = %v, %v", resp, err)
	}
	st, err := cl.MemberList(ctx)
	if err != nil || len(st.Members) != 3 {
		t.Fatalf("members = %v, %v; want 3", st, err)
	}
}

func TestRedisClusterFailsOver(t *testing.T) {
	t.Parallel()
	need(t, testbed.KindRedis)
	c, err := testbed.StartRedisCluster(t.Context(), testbed.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	if len(c.Nodes) != 6 {
		t.Fatalf("%d nodes, want 6", len(c.Nodes))
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// The project's client: it reloads the slot map when a node fails.
	cl, err := redisconn.Open(strings.Join(c.Addrs(), ","))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	slot, err := c.KeySlot(ctx, "{sku}")
	if err != nil {
		t.Fatal(err)
	}
	master, err := c.MasterOf(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := c.ReplicasOf(ctx, master)
	if err != nil || len(reps) != 1 {
		t.Fatalf("replicas of %d = %v, %v; want one", master, reps, err)
	}
	// Written on the master, and WAITed for: replication is asynchronous,
	// and a failover right after an unreplicated write loses it.
	mc := redis.NewClient(&redis.Options{Addr: c.Nodes[master].Addr, PoolSize: 1})
	defer mc.Close()
	if err := mc.Set(ctx, "{sku}", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := mc.Do(ctx, "wait", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}
	if err := c.Nodes[master].Kill(); err != nil {
		t.Fatal(err)
	}
	for {
		if role, err := c.Role(ctx, reps[0]); err == nil && role == "master" {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the replica never took over")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if now, err := c.MasterOf(ctx, slot); err != nil || now != reps[0] {
		t.Fatalf("master of slot %d = %d, %v; want the replica %d", slot, now, err, reps[0])
	}
	// The client follows the failover (a refreshed slot map).
	var got string
	for got, err = cl.Get(ctx, "{sku}").Result(); err != nil && ctx.Err() == nil; got, err = cl.Get(ctx, "{sku}").Result() {
		time.Sleep(100 * time.Millisecond)
	}
	if got != "x" {
		t.Fatalf("get after failover = %q, %v", got, err)
	}
	// The old master comes back as a replica of the new one.
	if err := c.Nodes[master].Restart(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		role, err := c.Role(ctx, master)
		if err == nil && role == "slave" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("restarted old master: role %q, %v", role, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(c.String(), c.Nodes[0].Addr) {
		t.Errorf("String() = %q", c.String())
	}
}
