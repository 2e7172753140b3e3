package redislock_test

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

// The Cluster tests of the shard Notifiers (review 3, F2, F4, F5). Their
// fallback timers are minutes long: only a wake-up by SPUBLISH ends a wait
// within the seconds they allow.
var slowFallback = redislock.Config{TTL: time.Minute, MinBackoff: 10 * time.Minute, MaxBackoff: 10 * time.Minute}

// An Acquire on a closed Locker, on a key another Locker holds, returns
// ErrClosed and opens no shard subscription: no goroutine and no pub/sub
// connection is left behind (review 3 F4: it made a Notifier that nobody
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
	l := redislock.New(c, slowFallback)
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
// fallback timer (review 3 F2).
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
