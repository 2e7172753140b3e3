package testbed_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oversold-lab/oversold/internal/testbed"
)

// cutBound is how long a request to a cut node is given: it must not answer
// in that time, while the other nodes answer well within it.
const cutBound = 500 * time.Millisecond

// checkClientCut cuts node k off from its clients (Clients[k].Cut) and
// checks that a request to it through its client address (ask) gets no
// answer within cutBound while every other node of nodes answers, then that
// node k answers again once restored. The cut lasts at least hold. A proxy
// that cut every node, or none, or clients that went around the proxies,
// fail it.
func checkClientCut(t *testing.T, c *testbed.Cluster, nodes []int, k int, hold time.Duration, ask func(ctx context.Context, i int) error) {
	t.Helper()
	for i, a := range c.Addrs() {
		if c.Clients == nil || a != c.Clients[i].Addr() || a == c.Nodes[i].Addr {
			t.Fatalf("client address of node %d = %s, want its proxy's (node at %s)", i, a, c.Nodes[i].Addr)
		}
	}
	askWithin := func(i int, d time.Duration) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		defer cancel()
		t0 := time.Now()
		err := ask(ctx, i)
		return time.Since(t0), err
	}
	for _, i := range nodes {
		if _, err := askWithin(i, 5*time.Second); err != nil {
			t.Fatalf("node %d before the cut: %v", i, err)
		}
	}
	if err := c.Clients[k].Cut(); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	if took, err := askWithin(k, cutBound); err == nil || took < cutBound*9/10 {
		t.Errorf("cut node %d answered after %v: %v; want no answer within %v", k, took.Round(time.Millisecond), err, cutBound)
	}
	for _, i := range nodes {
		if i == k {
			continue
		}
		if took, err := askWithin(i, 2*time.Second); err != nil {
			t.Errorf("node %d while node %d is cut: %v after %v", i, k, err, took.Round(time.Millisecond))
		}
	}
	time.Sleep(hold - time.Since(cutAt))
	c.Clients[k].Restore()
	t0 := time.Now()
	for {
		_, err := askWithin(k, cutBound)
		if err == nil {
			break
		}
		if time.Since(t0) > 10*time.Second {
			t.Fatalf("node %d still does not answer 10s after its restore: %v", k, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%s: node %d cut for clients, the others answered; back %v after its restore", c.Kind, k, time.Since(t0).Round(time.Millisecond))
}

func TestZooKeeperEnsembleClientCut(t *testing.T) {
	t.Parallel()
	need(t, testbed.KindZooKeeper)
	c, err := testbed.StartZooKeeperEnsemble(t.Context(), testbed.ClusterOptions{ClientProxies: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	// One session per node, each connected through that node's client
	// address only.
	conns := make([]*zk.Conn, len(c.Nodes))
	for i, a := range c.Addrs() {
		conn, _, err := zk.Connect([]string{a}, 2*time.Second, zk.WithLogger(quiet{}))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conns[i] = conn
	}
	ask := func(ctx context.Context, i int) error {
		done := make(chan error, 1)
		go func() {
			_, _, err := conns[i].Get("/zookeeper")
			done <- err
		}()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	checkClientCut(t, c, []int{0, 1, 2}, 1, 0, ask)
}

// quiet drops the zk client's log lines (a cut connection's are expected).
type quiet struct{}

func (quiet) Printf(string, ...any) {}

func TestEtcdClusterClientCut(t *testing.T) {
	t.Parallel()
	need(t, testbed.KindEtcd)
	c, err := testbed.StartEtcdCluster(t.Context(), testbed.ClusterOptions{ClientProxies: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	clients := make([]*clientv3.Client, len(c.Nodes))
	for i, a := range c.Addrs() {
		cl, err := clientv3.New(clientv3.Config{Endpoints: []string{a}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		clients[i] = cl
	}
	// Each member advertises its proxy: a client that syncs its endpoints
	// from the member list stays behind the proxies.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	members, err := clients[0].MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var advertised []string
	for _, m := range members.Members {
		advertised = append(advertised, m.ClientURLs...)
	}
	for _, a := range c.Addrs() {
		if !slices.Contains(advertised, "http://"+a) {
			t.Errorf("client URLs %v lack the proxy http://%s", advertised, a)
		}
	}
	ask := func(ctx context.Context, i int) error {
		_, err := clients[i].Put(ctx, fmt.Sprintf("cut-%d", i), "x")
		return err
	}
	checkClientCut(t, c, []int{0, 1, 2}, 2, 0, ask)
}

func TestRedisClusterClientCut(t *testing.T) {
	t.Parallel()
	need(t, testbed.KindRedis)
	c, err := testbed.StartRedisCluster(t.Context(), testbed.ClusterOptions{ClientProxies: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// A key on each master.
	keys := map[int]string{}
	for n := 0; len(keys) < 3; n++ {
		key := fmt.Sprintf("{cut%d}", n)
		slot, err := c.KeySlot(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		m, err := c.MasterOf(ctx, slot)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := keys[m]; !ok {
			keys[m] = key
		}
	}
	masters := make([]int, 0, len(keys))
	for m := range keys {
		masters = append(masters, m)
	}
	cut := masters[0]
	// Seeded with another node only: the client finds the cut master from
	// CLUSTER SLOTS, which must name its proxy.
	seed := c.Addrs()[masters[1]]
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{seed}, MaxRedirects: 1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer rc.Close()
	slots, err := rc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		for _, n := range s.Nodes {
			if !slices.Contains(c.Addrs(), n.Addr) {
				t.Errorf("CLUSTER SLOTS names %s for slots %d-%d: not a proxy (%v)", n.Addr, s.Start, s.End, c.Addrs())
			}
		}
	}
	// So does MOVED.
	one := redis.NewClient(&redis.Options{Addr: seed, MaxRetries: -1})
	defer one.Close()
	if err := one.Get(ctx, keys[cut]).Err(); err == nil || !strings.HasSuffix(err.Error(), " "+c.Addrs()[cut]) {
		t.Errorf("GET of node %d's key from node %d: %v; want MOVED to its proxy %s", cut, masters[1], err, c.Addrs()[cut])
	}
	// Replicas dial the address their master announces.
	if reps, err := c.ReplicasOf(ctx, cut); err != nil || len(reps) != 1 {
		t.Errorf("replicas of node %d = %v, %v; want one", cut, reps, err)
	}
	ask := func(ctx context.Context, i int) error { return rc.Set(ctx, keys[i], "x", 0).Err() }
	// Cut for three node timeouts: were its bus cut as well, the others
	// would mark it failed and vote its replica in.
	checkClientCut(t, c, masters, cut, 3*testbed.RedisClusterNodeTimeout, ask)
	// The bus is direct: cut for clients, the master was not failed over.
	if role, err := c.Role(ctx, cut); err != nil || role != "master" {
		t.Errorf("node %d after its client cut: role %q, %v; want master", cut, role, err)
	}
}
