package fairqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/redislock"
	"github.com/oversold-lab/oversold/locking/redislock/fairqueue"
	"github.com/oversold-lab/oversold/locking/redislock/internal/redislocktest"
	"github.com/oversold-lab/oversold/locking/redislock/reclaim"
)

// config is the suite's, shared with the recipe's tests.
type config = redislocktest.Config

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
	cfg := hardened(c.Locker())
	if broken != "" {
		cfg.Queue = reclaim.Wrap(fairqueue.Broken(broken))
	}
	return locktest.Closing(redislock.New(client, cfg), client.Close), nil
}

func TestMain(m *testing.M) { locktest.Main(m, open) }

func TestConformance(t *testing.T) {
	broken = locktest.Broken()
	addr := testbed.Redis(t)
	b, admin := redislocktest.Backend(t, addr)
	b.QueueConfig = &config{Addr: addr, TTL: time.Minute, FallbackWait: 10 * time.Minute}
	// The lock, and the queue entries and liveness of waiters.
	b.Leftovers = func(ctx context.Context, key string) (int, error) {
		n, err := admin.Exists(ctx, redislocktest.LockKey(key)).Result()
		if err != nil {
			return 0, err
		}
		q, err := admin.ZCard(ctx, redislocktest.LockKey(key)+":waiters").Result()
		if err != nil {
			return 0, err
		}
		a, err := admin.ZCard(ctx, redislocktest.LockKey(key)+":alive").Result()
		return int(n + q + a), err
	}
	locktest.Run(t, b)
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
	locktest.BenchUncontended(b, benchLocker(b, testbed.Redis(b)))
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
	locktest.BenchHotKey(b, lockers)
}

// BenchmarkHotKey8OneLocker is BenchmarkHotKey8 with the 8 contenders in
// one Locker: a release wakes one of them, not all.
func BenchmarkHotKey8OneLocker(b *testing.B) {
	l := benchLocker(b, testbed.Redis(b))
	locktest.BenchHotKey(b, []*redislock.Locker{l, l, l, l, l, l, l, l})
}

func benchLocker(b *testing.B, addr string) *redislock.Locker {
	return redislocktest.BenchLocker(b, addr, hardened(redislock.Config{TTL: 5 * time.Second}))
}

// The same suite on a Redis Cluster of three masters with a replica each.
func TestConformanceCluster(t *testing.T) {
	locktest.Run(t, redislocktest.ClusterBackend(testbed.RedisCluster(t)))
}

// A woken waiter keeps its place: newcomers do not jump the queue.
func TestFairHandoff(t *testing.T) {
	addr := testbed.Redis(t)
	locktest.FairHandoff(t, locktest.Backend[config]{Name: "redis", Config: config{Addr: addr, TTL: 10 * time.Second}, TTL: 10 * time.Second}, 6, 300)
}
