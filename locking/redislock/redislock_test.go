package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/redislock"
)

// config is what the suite opens a Locker from.
type config struct {
	Addr         string // one address, or a Cluster's joined by commas
	TTL          time.Duration
	FallbackWait time.Duration // 0: the default jittered fallback timer
}

// open is how the suite opens the recipe alone, here and in its helper
// processes: no Queue but its own.
func open(_ context.Context, c config) (locking.Locker, error) {
	client, err := redisconn.Open(c.Addr)
	if err != nil {
		return nil, err
	}
	l := redislock.New(client, redislock.Config{TTL: c.TTL, MinBackoff: c.FallbackWait, MaxBackoff: c.FallbackWait})
	redislock.Break(l, broken)
	return locktest.Closing(l, client.Close), nil
}

func TestMain(m *testing.M) { locktest.Main(m, open) }

// broken is the broken variant TestConformance runs, if any (TestSuiteTeeth).
var broken string

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
		State: func(ctx context.Context) (string, error) {
			n, err := admin.DBSize(ctx).Result()
			return fmt.Sprintf("%d Redis keys (a fence counter per lock key ever used)", n), err
		},
		Leftovers: func(ctx context.Context, key string) (int, error) {
			n, err := admin.Exists(ctx, lockKey(key)).Result()
			return int(n), err
		},
	})
}

// TestSuiteTeeth runs the suite against Lockers each broken in one way, and
// checks that it fails each, in the subtest that checks the broken promise.
func TestSuiteTeeth(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite seven times")
	}
	locktest.Teeth(t, map[string]string{
		redislock.BareDel:        "ReleaseByOwnerOnly",
		redislock.BarePexpire:    "LostWhenTakenOver",
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
// one Locker.
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
	l := redislock.New(c, redislock.Config{TTL: 5 * time.Second})
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

// Close ends the waits in progress.
func TestCloseEndsWaits(t *testing.T) {
	addr := testbed.Redis(t)
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	holder, waiter := newLocker(t, addr, redislock.Config{}), newLocker(t, addr, redislock.Config{})
	lease, err := holder.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(t.Context(), "k")
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	waiter.Close()
	select {
	case err := <-got:
		if !errors.Is(err, redislock.ErrClosed) {
			t.Fatalf("wait ended with %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the wait")
	}
}

func newLocker(t *testing.T, addr string, cfg redislock.Config) *redislock.Locker {
	c, err := redisconn.Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	l := redislock.New(c, cfg)
	t.Cleanup(func() { l.Close(); c.Close() })
	return l
}

// A try whose reply is lost after the SET ran (ctx ended while the reply
// was on its way) leaves no key behind: Acquire deletes it, on a fresh
// context, before it returns. The Locker reaches Redis through a proxy
// that delays each direction by 300 ms, on connections made and scripts
// loaded before, and its ctx ends 450 ms after the try was sent: after the
// SET ran, before its reply came back.
func TestLostReplyRemoved(t *testing.T) {
	addr := testbed.Redis(t)
	proxy, err := testbed.StartProxy("redis", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	// Connections made before the delay: a dial through it would cost the
	// whole wait, and the cleanup's bound (a second).
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true, PoolSize: 16})
	conns := make([]*redis.Conn, 16)
	for i := range conns {
		conns[i] = c.Conn()
		if err := conns[i].Ping(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, conn := range conns {
		conn.Close() // back to the pool
	}
	l := redislock.New(c, redislock.Config{TTL: time.Minute})
	t.Cleanup(func() { l.Close(); c.Close() })
	warm, err := l.Acquire(t.Context(), testbed.Prefix(t)+"-warm") // loads the scripts: EVALSHA then works at once
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := proxy.Latency(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for i := range 5 { // a try that did not reach Redis in time shows nothing: again
		key := fmt.Sprintf("%s-%d", testbed.Prefix(t), i)
		ctx, cancel := context.WithTimeout(t.Context(), 450*time.Millisecond)
		lease, err := l.Acquire(ctx, key)
		cancel()
		if err == nil {
			lease.Release(t.Context())
			t.Fatal("Acquire returned a lease after its ctx ended")
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire: %v, want an error wrapping context.DeadlineExceeded", err)
		}
		if admin.Get(t.Context(), lockKey(key)+":fence").Val() == "" {
			continue // the SET never ran
		}
		if n := admin.Exists(t.Context(), lockKey(key)).Val(); n != 0 {
			t.Fatalf("the key of a try whose reply was lost is still there (PTTL %v)", admin.PTTL(t.Context(), lockKey(key)).Val())
		}
		return
	}
	t.Fatal("no try reached Redis within 450 ms through a 300 ms proxy: the harness cannot show a lost reply")
}
