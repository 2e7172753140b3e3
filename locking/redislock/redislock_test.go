package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/redislock"
	"github.com/oversold-lab/oversold/locking/redislock/internal/redislocktest"
)

// config is the suite's, shared with the hardening packages' tests.
type config = redislocktest.Config

// open is how the suite opens the recipe alone, here and in its helper
// processes: no Queue but its own.
func open(_ context.Context, c config) (locking.Locker, error) {
	client, err := redisconn.Open(c.Addr)
	if err != nil {
		return nil, err
	}
	l := redislock.New(client, c.Locker())
	redislock.Break(l, broken)
	return locktest.Closing(l, client.Close), nil
}

func TestMain(m *testing.M) { locktest.Main(m, open) }

// broken is the broken variant TestConformance runs, if any (TestSuiteTeeth).
var broken string

func TestConformance(t *testing.T) {
	broken = locktest.Broken()
	b, _ := redislocktest.Backend(t, testbed.Redis(t))
	locktest.Run(t, b)
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
// one Locker.
func BenchmarkHotKey8OneLocker(b *testing.B) {
	l := benchLocker(b, testbed.Redis(b))
	locktest.BenchHotKey(b, []*redislock.Locker{l, l, l, l, l, l, l, l})
}

func benchLocker(b *testing.B, addr string) *redislock.Locker {
	return redislocktest.BenchLocker(b, addr, redislock.Config{TTL: 5 * time.Second})
}

// The same suite on a Redis Cluster of three masters with a replica each.
func TestConformanceCluster(t *testing.T) {
	locktest.Run(t, redislocktest.ClusterBackend(testbed.RedisCluster(t)))
}

// Close ends the waits in progress.
func TestCloseEndsWaits(t *testing.T) {
	addr := testbed.Redis(t)
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	redislocktest.CloseEndsWaits(t, newLocker(t, addr, redislock.Config{}), newLocker(t, addr, redislock.Config{}))
}

func newLocker(t *testing.T, addr string, cfg redislock.Config) *redislock.Locker {
	return redislocktest.NewLocker(t, addr, cfg)
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
		if admin.Get(t.Context(), redislocktest.LockKey(key)+":fence").Val() == "" {
			continue // the SET never ran
		}
		if n := admin.Exists(t.Context(), redislocktest.LockKey(key)).Val(); n != 0 {
			t.Fatalf("the key of a try whose reply was lost is still there (PTTL %v)", admin.PTTL(t.Context(), redislocktest.LockKey(key)).Val())
		}
		return
	}
	t.Fatal("no try reached Redis within 450 ms through a 300 ms proxy: the harness cannot show a lost reply")
}
