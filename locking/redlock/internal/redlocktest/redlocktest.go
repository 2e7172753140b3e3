// Package redlocktest is test wiring, imported only by _test files: what
// the tests of the recipe (locking/redlock) and of its hardening packages
// (quorum, fairwake) share to run the conformance suite and their own
// tests on real redis-servers. A team copying the recipe copies
// redlock_test.go with this package (or inlines the few helpers it uses).
package redlocktest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/redlock"
)

// Config is what the suite opens a Locker from.
type Config struct {
	Addrs        []string
	TTL          time.Duration
	NodeTimeout  time.Duration // 0: redlock's default
	FallbackWait time.Duration // 0: the default jittered fallback timer
}

// New builds a Locker on clients: redlock.New for the recipe alone,
// backends.NewRedlock for the composition orderd runs.
type New func([]redis.UniversalClient, redlock.Config) (*redlock.Locker, error)

// Open is the open the suite runs (locktest.Main), here and in its helper
// processes: a client per address, the Locker from newLocker.
func Open(newLocker New) func(context.Context, Config) (locking.Locker, error) {
	return func(_ context.Context, c Config) (locking.Locker, error) {
		var (
			clients []redis.UniversalClient
			closers []func() error
		)
		for _, addr := range c.Addrs {
			client, err := redisconn.Open(addr)
			if err != nil {
				return nil, errors.Join(append([]error{err}, closeAll(closers)...)...)
			}
			clients, closers = append(clients, client), append(closers, client.Close)
		}
		l, err := newLocker(clients, redlock.Config{TTL: c.TTL, NodeTimeout: c.NodeTimeout,
			MinBackoff: c.FallbackWait, MaxBackoff: c.FallbackWait})
		if err != nil {
			return nil, errors.Join(append([]error{err}, closeAll(closers)...)...)
		}
		return locktest.Closing(l, closers...), nil
	}
}

func closeAll(closers []func() error) []error {
	var errs []error
	for _, c := range closers {
		errs = append(errs, c())
	}
	return errs
}

// ConformanceNodeTimeout bounds one request to one node in the suite. The
// default with its 1 s TTL, 50 ms, is shorter than a -race request takes
// on this shared 2-core machine under load: at load 15, three Acquires in
// a row without a majority's answer in time failed the suite with
// ErrUnavailable in 3 runs of 3, three healthy nodes all up.
const ConformanceNodeTimeout = 300 * time.Millisecond

// LockKey is the Redis key of a lock key, with the default prefix.
func LockKey(key string) string { return "lock:{" + key + "}" }

// Backend is the suite's description of redlock on the servers at addrs:
// TakeOver puts another owner's value on every node, for a minute, and
// Leftovers counts the lock key's distinct owners across the nodes.
func Backend(t *testing.T, addrs []string) locktest.Backend[Config] {
	admins := Clients(t, addrs)
	through := func(addrs []string) Config {
		return Config{Addrs: addrs, TTL: time.Second, NodeTimeout: ConformanceNodeTimeout}
	}
	return locktest.Backend[Config]{
		Name:    "redlock",
		Config:  through(addrs),
		TTL:     time.Second,
		Servers: addrs,
		Through: through,
		TakeOver: func(ctx context.Context, key string) (func(context.Context) error, error) {
			for _, c := range admins {
				if err := c.Set(ctx, LockKey(key), "rival", time.Minute).Err(); err != nil {
					return nil, err
				}
			}
			return func(ctx context.Context) error {
				for _, c := range admins {
					if err := c.Del(ctx, LockKey(key)).Err(); err != nil {
						return err
					}
				}
				return nil
			}, nil
		},
		Leftovers: Leftovers(admins),
	}
}

// Leftovers counts what a key leaves on the nodes of admins. One lease is
// a key on every node, all with its owner: it counts the distinct owners,
// so that a waiter's key left on any node shows; and the members of the
// sorted sets named by the suffixes (a queue's entries), but tombstones,
// which lapse with the TTL.
func Leftovers(admins []redis.UniversalClient, sets ...string) func(context.Context, string) (int, error) {
	return func(ctx context.Context, key string) (int, error) {
		owners := map[string]bool{}
		for _, c := range admins {
			owner, err := c.Get(ctx, LockKey(key)).Result()
			switch {
			case err == redis.Nil:
			case err != nil:
				return 0, err
			default:
				owners[owner] = true
			}
			for _, set := range sets {
				members, err := c.ZRange(ctx, LockKey(key)+set, 0, -1).Result()
				if err != nil {
					return 0, err
				}
				for _, m := range members {
					if !strings.HasPrefix(m, "gone:") {
						owners[set+" "+m] = true
					}
				}
			}
		}
		return len(owners), nil
	}
}

// Clients opens a plain client per address, closed when the test ends.
func Clients(tb testing.TB, addrs []string) []redis.UniversalClient {
	var cs []redis.UniversalClient
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		tb.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs
}

// Locker opens newLocker's Locker with cfg on plain clients, all closed
// when the test ends.
func Locker(tb testing.TB, newLocker New, addrs []string, cfg redlock.Config) *redlock.Locker {
	l, err := newLocker(Clients(tb, addrs), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

// ProxiedLocker opens its clients as orderd does (ctx deadlines bound each
// request) and newLocker's Locker on them, all closed when the test ends.
func ProxiedLocker(tb testing.TB, newLocker New, addrs []string, cfg redlock.Config) *redlock.Locker {
	var cs []redis.UniversalClient
	for _, a := range addrs {
		c, err := redisconn.Open(a)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	l, err := newLocker(cs, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

// Proxied puts a proxy in front of each address.
func Proxied(tb testing.TB, addrs []string) ([]string, testbed.Proxies) {
	var (
		paths   []string
		proxies testbed.Proxies
	)
	for i, a := range addrs {
		p, err := testbed.StartProxy(fmt.Sprintf("redis%d", i), a)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(p.Close)
		paths, proxies = append(paths, p.Addr()), append(proxies, p)
	}
	return paths, proxies
}

// OwnRedises starts three private redis-servers for a test that kills or
// stops them.
func OwnRedises(t *testing.T) ([]*testbed.Server, []string) {
	if cmd := testbed.Missing(testbed.KindRedis); cmd != "" {
		t.Skip(cmd)
	}
	var (
		servers []*testbed.Server
		addrs   []string
	)
	for range 3 {
		s, err := testbed.StartRedis(t.Context(), testbed.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Stop() })
		servers, addrs = append(servers, s), append(addrs, s.Addr)
	}
	return servers, addrs
}

// NoLeaks checks, after the test's cleanups, that it left no goroutines
// behind; call it after starting the servers.
func NoLeaks(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		goleak.VerifyNone(t, before,
			// go-redis probes a dead server every second; the probe ends at
			// the first look after its client was closed.
			goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
	})
}
