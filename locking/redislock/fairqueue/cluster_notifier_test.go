package fairqueue_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/redislock"
)

// The Cluster tests of the shard Notifiers. Their
// fallback timers are minutes long: only a wake-up by SPUBLISH ends a wait
// within the seconds they allow.
var slowFallback = redislock.Config{TTL: time.Minute, MinBackoff: 10 * time.Minute, MaxBackoff: 10 * time.Minute}

// An Acquire on a closed Locker, on a key another Locker holds, returns
// ErrClosed and opens no shard subscription: no goroutine and no pub/sub
// connection is left behind (before, it made a Notifier that nobody
// closed, one connection and two goroutines per master for good).
func TestClusterClosedLockerOpensNothing(t *testing.T) {
	addrs := testbed.RedisCluster(t)
	key := testbed.Prefix(t)
	holder := newLocker(t, strings.Join(addrs, ","), slowFallback)
	lease, err := holder.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())

	c, err := redisconn.Open(strings.Join(addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The Cluster client's node clients start goroutines at first use: use
	// the key's node before counting.
	if err := c.Exists(t.Context(), "lock:{"+key+"}").Err(); err != nil {
		t.Fatal(err)
	}
	l := redislock.New(c, hardened(slowFallback))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	subscribers := pubsubClients(t, addrs)
	before := goleak.IgnoreCurrent()

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := l.Acquire(ctx, key); !errors.Is(err, redislock.ErrClosed) {
		t.Fatalf("Acquire on a closed Locker: %v, want ErrClosed", err)
	}
	goleak.VerifyNone(t, before)
	if got := pubsubClients(t, addrs); got != subscribers {
		t.Fatalf("pub/sub connections on the masters went from %d to %d", subscribers, got)
	}
}

// pubsubClients counts the pub/sub connections of every node.
func pubsubClients(t *testing.T, addrs []string) int {
	t.Helper()
	n := 0
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		list, err := c.ClientList(t.Context()).Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.SplitSeq(list, "\n") {
			if strings.Contains(l, "flags=P") {
				n++
			}
		}
	}
	return n
}

// When a shard Notifier's connection breaks (CLIENT KILL) while it has
// waiters on two keys in different slots of one master, it subscribes
// again, and both waiters are then woken by their releases' SPUBLISH.
// One SSUBSCRIBE naming both channels would be refused (CROSSSLOT) and the
// Notifier would restart in a loop for good, leaving every wait to its
// fallback timer.
func TestClusterNotifierResubscribesAcrossSlots(t *testing.T) {
	addrs := testbed.RedisCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	addr := strings.Join(addrs, ",")
	holder, waiter := newLocker(t, addr, slowFallback), newLocker(t, addr, slowFallback)
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer admin.Close()
	prefix := testbed.Prefix(t)
	keys, master := twoSlotsOneMaster(t, admin, prefix)

	leases := make([]locking.Lease, len(keys))
	for i, k := range keys {
		var err error
		if leases[i], err = holder.Acquire(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]<-chan time.Time, len(keys))
	for i, k := range keys {
		got[i] = acquireLater(t, ctx, waiter, k)
	}
	pattern := "lock:{" + prefix + "*"
	waitShardChannels(t, ctx, master, pattern, len(keys), "the waiters' subscriptions")

	// The server drops a killed client's subscriptions at once: those
	// counted next are the new connection's.
	if n, err := master.ClientKillByFilter(ctx, "TYPE", "pubsub").Result(); err != nil || n == 0 {
		t.Fatalf("client kill: %d killed, %v", n, err)
	}
	waitShardChannels(t, ctx, master, pattern, len(keys), "the subscriptions again, one per slot")

	for i, k := range keys {
		released := time.Now()
		if err := leases[i].Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-got[i]:
			t.Logf("%s: woken %v after the release", k, at.Sub(released).Round(time.Microsecond))
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the waiter was not woken within 5 s of the release after the reconnect", k)
		}
	}
}

// twoSlotsOneMaster returns two lock keys starting with prefix whose
// slots differ and are served by one master, and a client of that master.
func twoSlotsOneMaster(t *testing.T, c *redis.ClusterClient, prefix string) ([]string, *redis.Client) {
	t.Helper()
	first := prefix + "-0"
	master, err := c.MasterForKey(t.Context(), "lock:{"+first+"}")
	if err != nil {
		t.Fatal(err)
	}
	slot := func(k string) int64 { return c.ClusterKeySlot(t.Context(), k).Val() }
	for i := 1; i < 1000; i++ {
		k := prefix + "-" + strconv.Itoa(i)
		m, err := c.MasterForKey(t.Context(), "lock:{"+k+"}")
		if err != nil {
			t.Fatal(err)
		}
		if m == master && slot(k) != slot(first) {
			return []string{first, k}, master
		}
	}
	t.Fatal("no two keys on one master")
	return nil, nil
}

// acquireLater acquires key on l in the background, releases it at once,
// and sends the time it was granted.
func acquireLater(t *testing.T, ctx context.Context, l *redislock.Locker, key string) <-chan time.Time {
	got := make(chan time.Time, 1)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	wg.Go(func() {
		lease, err := l.Acquire(ctx, key)
		at := time.Now()
		if err != nil {
			t.Errorf("acquire %s: %v", key, err)
			return
		}
		if err := lease.Release(context.Background()); err != nil {
			t.Errorf("release %s: %v", key, err)
		}
		got <- at
	})
	return got
}

// waitShardChannels waits until master has want shard channels matching
// pattern subscribed (PUBSUB SHARDCHANNELS).
func waitShardChannels(t *testing.T, ctx context.Context, master *redis.Client, pattern string, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		chs, err := master.PubSubShardChannels(ctx, pattern).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(chs) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %d shard channels subscribed after 10 s, want %d", what, len(chs), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A master that leaves the Cluster client's slot map for over a minute
// has its node client closed by go-redis; back at the same address (a
// failback) it gets a new client. Waits on its slots must then be woken by
// SPUBLISH again, through a Notifier on the new client: the one cached on
// the closed client hears nothing. The test takes a minute
// and more, go-redis's delay before it closes a node's client. The master
// leaves and comes back only in the waiter's slot map (ClusterOptions.
// ClusterSlots names it by another address meanwhile); the server is real
// and stays up.
func TestClusterNotifierFollowsNodeClient(t *testing.T) {
	if testing.Short() {
		t.Skip("waits a minute for go-redis to close a node's client")
	}
	addrs := testbed.RedisCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	key := testbed.Prefix(t)
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer admin.Close()
	real, err := admin.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	m, err := admin.MasterForKey(ctx, "lock:{"+key+"}")
	if err != nil {
		t.Fatal(err)
	}
	master := redis.NewClient(&redis.Options{Addr: m.Options().Addr})
	defer master.Close()
	_, port, _ := strings.Cut(m.Options().Addr, ":")

	var (
		mu   sync.Mutex
		away bool // the master is named localhost:port, not by its address
	)
	cc := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
		mu.Lock()
		defer mu.Unlock()
		out := make([]redis.ClusterSlot, len(real))
		for i, s := range real {
			out[i] = redis.ClusterSlot{Start: s.Start, End: s.End, Nodes: append([]redis.ClusterNode(nil), s.Nodes...)}
			if away && strings.HasSuffix(s.Nodes[0].Addr, ":"+port) {
				out[i].Nodes[0].Addr = "localhost:" + port
			}
		}
		return out, nil
	}})
	defer cc.Close()
	waiter := redislock.New(cc, hardened(slowFallback))
	defer waiter.Close()
	holder := newLocker(t, strings.Join(addrs, ","), slowFallback)

	nodeClient := func() *redis.Client {
		c, err := cc.MasterForKey(ctx, "lock:{"+key+"}")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// handoff has the waiter queue behind the holder, waits until it is
	// subscribed on the master, releases, and requires a prompt wake-up.
	handoff := func(round string) {
		lease, err := holder.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		got := acquireLater(t, ctx, waiter, key)
		waitShardChannels(t, ctx, master, "lock:{"+key+"}:wake:*", 1, round+": the waiter's subscription on the master")
		released := time.Now()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-got:
			t.Logf("%s: woken %v after the release", round, at.Sub(released).Round(time.Microsecond))
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the waiter was not woken within 5 s of the release", round)
		}
	}
	// rename moves the master in the waiter's slot map and waits until its
	// client follows.
	rename := func(gone bool, moved func(*redis.Client) bool) {
		mu.Lock()
		away = gone
		mu.Unlock()
		deadline := time.Now().Add(10 * time.Second)
		for cc.ReloadState(ctx); !moved(nodeClient()); cc.ReloadState(ctx) {
			if time.Now().After(deadline) {
				t.Fatal("the slot map did not change in 10 s")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	first := nodeClient()
	handoff("before")
	rename(true, func(c *redis.Client) bool { return c != first })
	t.Log("master out of the slot map; waiting for go-redis to close its client")
	for first.Ping(ctx).Err() != redis.ErrClosed {
		if ctx.Err() != nil {
			t.Fatal("go-redis did not close the client of a node out of the slot map")
		}
		time.Sleep(500 * time.Millisecond)
	}
	rename(false, func(c *redis.Client) bool { return c.Options().Addr == first.Options().Addr })
	if nodeClient() == first {
		t.Fatal("the master back at its address has its closed client")
	}
	handoff("back at its address, new client")
}

// A slot that migrates during a wait moves the wait at once: the old master
// pushes an unsolicited sunsubscribe to its shard subscribers (Redis 7),
// and the waiter subscribes on the new master and is woken there by the
// release's SPUBLISH. The fallback timers are 10 minutes: read as a
// confirmation of the subscription, the push left the wait on the old
// master until its fallback. The slot goes back at the end.
func TestClusterWaitFollowsMigratedSlot(t *testing.T) {
	addrs := testbed.RedisCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	key := testbed.Prefix(t)
	slot, from, to := lockSlot(t, ctx, addrs, key)
	addr := strings.Join(addrs, ",")
	holder, waiter := newLocker(t, addr, slowFallback), newLocker(t, addr, slowFallback)
	lease, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireLater(t, ctx, waiter, key)
	channel := "lock:{" + key + "}:wake:*"
	waitShardChannels(t, ctx, from.Client, channel, 1, "the waiter's subscription")

	migrateSlot(t, ctx, slot, from, to)
	t.Cleanup(func() { migrateSlot(t, context.Background(), slot, to, from) })
	moved := time.Now()
	waitShardChannels(t, ctx, to.Client, channel, 1, "the waiter's subscription on the slot's new master")
	t.Logf("subscribed on the new master %v after the migration", time.Since(moved).Round(time.Millisecond))
	releaseWakes(t, ctx, lease.Release, got)
}

// master is one Cluster master: its node id, address and a client of it.
type master struct {
	ID, Addr string
	Client   *redis.Client
}

// lockSlot returns the slot of key's lock, its master and another master.
func lockSlot(t *testing.T, ctx context.Context, addrs []string, key string) (slot int, from, to master) {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer c.Close()
	slot = int(c.ClusterKeySlot(ctx, "lock:{"+key+"}").Val())
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		m := master{ID: s.Nodes[0].ID, Addr: s.Nodes[0].Addr}
		if slot >= s.Start && slot <= s.End {
			from = m
		}
	}
	for _, s := range slots {
		if s.Nodes[0].ID != from.ID {
			to = master{ID: s.Nodes[0].ID, Addr: s.Nodes[0].Addr}
			break
		}
	}
	if from.ID == "" || to.ID == "" {
		t.Fatalf("slot %d: no master, or no other master", slot)
	}
	for _, m := range []*master{&from, &to} {
		m.Client = redis.NewClient(&redis.Options{Addr: m.Addr})
		t.Cleanup(func() { m.Client.Close() })
	}
	return slot, from, to
}

// migrateSlot moves slot and its keys from one master to another, as
// redis-cli --cluster reshard does: IMPORTING and MIGRATING, MIGRATE of
// every key, then SETSLOT NODE on the destination, the source and the
// other masters.
func migrateSlot(t *testing.T, ctx context.Context, slot int, from, to master) {
	t.Helper()
	do := func(c *redis.Client, args ...any) {
		t.Helper()
		if err := c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v on %s: %v", args, c.Options().Addr, err)
		}
	}
	do(to.Client, "cluster", "setslot", slot, "importing", from.ID)
	do(from.Client, "cluster", "setslot", slot, "migrating", to.ID)
	host, port, _ := strings.Cut(to.Addr, ":")
	for {
		keys, err := from.Client.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		do(from.Client, args...)
	}
	do(to.Client, "cluster", "setslot", slot, "node", to.ID)
	do(from.Client, "cluster", "setslot", slot, "node", to.ID)
	slots, err := to.Client.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if id := s.Nodes[0].ID; id != from.ID && id != to.ID {
			c := redis.NewClient(&redis.Options{Addr: s.Nodes[0].Addr})
			do(c, "cluster", "setslot", slot, "node", to.ID)
			c.Close()
		}
	}
}
