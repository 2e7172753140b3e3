package fairqueue_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/redislock"
	"github.com/oversold-lab/oversold/locking/redislock/fairqueue"
	"github.com/oversold-lab/oversold/locking/redislock/reclaim"
)

// config is what the suite opens a Locker from.
type config struct {
	Addr         string // one address, or a Cluster's joined by commas
	TTL          time.Duration
	FallbackWait time.Duration // 0: the default jittered fallback timer
}

// hardened is cfg with the Queue locking/backends composes: this fair
// queue, and the re-release of a key a failover kept.
func hardened(cfg redislock.Config) redislock.Config {
	cfg.Queue = reclaim.Wrap(fairqueue.New)
	return cfg
}

// broken is the broken variant TestConformance runs, if any (TestSuiteTeeth).
var broken string

// open is how the suite opens the hardened Locker, here and in its helper
// processes.
func open(_ context.Context, c config) (locking.Locker, error) {
	client, err := redisconn.Open(c.Addr)
	if err != nil {
		return nil, err
	}
	cfg := hardened(redislock.Config{TTL: c.TTL, MinBackoff: c.FallbackWait, MaxBackoff: c.FallbackWait})
	if broken != "" {
		cfg.Queue = reclaim.Wrap(fairqueue.Broken(broken))
	}
	return locktest.Closing(redislock.New(client, cfg), client.Close), nil
}

func TestMain(m *testing.M) { locktest.Main(m, open) }

func lockKey(key string) string { return "lock:{" + key + "}" } // the default prefix

// takeOver sets another owner's value on the lock key, for a minute.
func takeOver(ctx context.Context, c redis.Cmdable, key string) (func(context.Context) error, error) {
	if err := c.Set(ctx, lockKey(key), "rival", time.Minute).Err(); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return c.Del(ctx, lockKey(key)).Err() }, nil
}

func TestConformance(t *testing.T) {
	broken = locktest.Broken()
	addr := testbed.Redis(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	locktest.Run(t, locktest.Backend[config]{
		Name:    "redis",
		Config:  config{Addr: addr, TTL: time.Second},
		TTL:     time.Second,
		Servers: []string{addr},
		Through: func(addrs []string) config { return config{Addr: addrs[0], TTL: time.Second} },
		TakeOver: func(ctx context.Context, key string) (func(context.Context) error, error) {
			return takeOver(ctx, admin, key)
		},
		QueueConfig: &config{Addr: addr, TTL: time.Minute, FallbackWait: 10 * time.Minute},
		State: func(ctx context.Context) (string, error) {
			n, err := admin.DBSize(ctx).Result()
			return fmt.Sprintf("%d Redis keys (a fence counter per lock key ever used)", n), err
		},
		// The lock, and the queue entries and liveness of waiters.
		Leftovers: func(ctx context.Context, key string) (int, error) {
			n, err := admin.Exists(ctx, lockKey(key)).Result()
			if err != nil {
				return 0, err
			}
			q, err := admin.ZCard(ctx, lockKey(key)+":waiters").Result()
			if err != nil {
				return 0, err
			}
			a, err := admin.ZCard(ctx, lockKey(key)+":alive").Result()
			return int(n + q + a), err
		},
	})
}

// TestSuiteTeeth runs the suite against Lockers each broken in one way, and
// checks that it fails each, in the subtest that checks the broken promise.
// The renewal is the recipe's: its teeth are in locking/redislock.
func TestSuiteTeeth(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite six times")
	}
	locktest.Teeth(t, map[string]string{
		fairqueue.BareDel:        "ReleaseByOwnerOnly",
		locktest.RepeatingToken:  "MutualExclusionGoroutines",
		locktest.IgnoringCtx:     "ReleaseByOwnerOnly",
		locktest.LostNeverCloses: "LostWhenTakenOver",
		locktest.ReleaseByKey:    "ReleaseByOwnerOnly",
		locktest.LeakingTimer:    "ManyKeys",
	})
}

// BenchmarkUncontended measures one Acquire and Release of a free key.
func BenchmarkUncontended(b *testing.B) {
	l := benchLocker(b, testbed.Redis(b))
	ctx := context.Background()
	for b.Loop() {
		lease, err := l.Acquire(ctx, "uncontended")
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHotKey8 measures handoffs of one key among 8 contenders, each
// with its own Locker and connections, as if in 8 processes: ns/op is the
// time per handoff.
func BenchmarkHotKey8(b *testing.B) {
	addr := testbed.Redis(b)
	lockers := make([]*redislock.Locker, 8)
	for i := range lockers {
		lockers[i] = benchLocker(b, addr)
	}
	hotKey(b, lockers)
}

// BenchmarkHotKey8OneLocker is BenchmarkHotKey8 with the 8 contenders in
// one Locker: a release wakes one of them, not all.
func BenchmarkHotKey8OneLocker(b *testing.B) {
	l := benchLocker(b, testbed.Redis(b))
	hotKey(b, []*redislock.Locker{l, l, l, l, l, l, l, l})
}

// hotKey runs one contender per entry of lockers until b.N handoffs.
func hotKey(b *testing.B, lockers []*redislock.Locker) {
	ctx := context.Background()
	var (
		left atomic.Int64
		wg   sync.WaitGroup
	)
	left.Store(int64(b.N))
	b.ResetTimer()
	for _, l := range lockers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				lease, err := l.Acquire(ctx, "hot")
				if err != nil {
					b.Error(err)
					return
				}
				if err := lease.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func benchLocker(b *testing.B, addr string) *redislock.Locker {
	c := redis.NewClient(&redis.Options{Addr: addr})
	l := redislock.New(c, hardened(redislock.Config{TTL: 5 * time.Second}))
	b.Cleanup(func() { l.Close(); c.Close() })
	return l
}

// The same suite on a Redis Cluster of three masters with a replica each:
// the lock key, its fence counter and its channel share the hash slot of
// {key}, and the release message reaches a subscriber on any node.
func TestConformanceCluster(t *testing.T) {
	addrs := testbed.RedisCluster(t)
	// A client per call: a Cluster client's node clients start goroutines
	// lazily, which the suite's leak check would count.
	admin := func(ctx context.Context, do func(*redis.ClusterClient) error) error {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		defer c.Close()
		return do(c)
	}
	locktest.Run(t, locktest.Backend[config]{
		Name:   "redis",
		Config: config{Addr: strings.Join(addrs, ","), TTL: time.Second},
		TTL:    time.Second,
		TakeOver: func(ctx context.Context, key string) (drop func(context.Context) error, err error) {
			err = admin(ctx, func(c *redis.ClusterClient) error { _, err := takeOver(ctx, c, key); return err })
			drop = func(ctx context.Context) error {
				return admin(ctx, func(c *redis.ClusterClient) error { return c.Del(ctx, lockKey(key)).Err() })
			}
			return drop, err
		},
		Leftovers: func(ctx context.Context, key string) (n int, err error) {
			err = admin(ctx, func(c *redis.ClusterClient) error {
				m, err := c.Exists(ctx, lockKey(key)).Result()
				n = int(m)
				return err
			})
			return n, err
		},
	})
}

// A woken waiter keeps its place: newcomers do not jump the queue.
func TestFairHandoff(t *testing.T) {
	addr := testbed.Redis(t)
	locktest.FairHandoff(t, locktest.Backend[config]{Name: "redis", Config: config{Addr: addr, TTL: 10 * time.Second}, TTL: 10 * time.Second}, 6, 300)
}
