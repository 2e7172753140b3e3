// Package redislocktest is test wiring, imported only by _test files: what
// the tests of the recipe (locking/redislock) and of its hardening packages
// (fairqueue, reclaim) share to run the conformance suite and their own
// tests on a real redis-server or Cluster. A team copying the recipe copies
// redislock_test.go with this package (or inlines the few helpers it uses).
package redislocktest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/redislock"
)

// Config is what the suite opens a Locker from.
type Config struct {
	Addr         string // one address, or a Cluster's joined by commas
	TTL          time.Duration
	FallbackWait time.Duration // 0: the default jittered fallback timer
}

// Locker is the recipe's Config for c.
func (c Config) Locker() redislock.Config {
	return redislock.Config{TTL: c.TTL, MinBackoff: c.FallbackWait, MaxBackoff: c.FallbackWait}
}

// LockKey is the Redis key of a lock key, with the default prefix.
func LockKey(key string) string { return "lock:{" + key + "}" }

// TakeOver sets another owner's value on the lock key, for a minute.
func TakeOver(ctx context.Context, c redis.Cmdable, key string) (func(context.Context) error, error) {
	if err := c.Set(ctx, LockKey(key), "rival", time.Minute).Err(); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return c.Del(ctx, LockKey(key)).Err() }, nil
}

// Backend is the suite's description of the lock on the redis-server at
// addr, and the client it inspects the server with (closed when the test
// ends). Leftovers counts the lock key.
func Backend(t *testing.T, addr string) (locktest.Backend[Config], *redis.Client) {
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	return locktest.Backend[Config]{
		Name:    "redis",
		Config:  Config{Addr: addr, TTL: time.Second},
		TTL:     time.Second,
		Servers: []string{addr},
		Through: func(addrs []string) Config { return Config{Addr: addrs[0], TTL: time.Second} },
		TakeOver: func(ctx context.Context, key string) (func(context.Context) error, error) {
			return TakeOver(ctx, admin, key)
		},
		State: func(ctx context.Context) (string, error) {
			n, err := admin.DBSize(ctx).Result()
			return fmt.Sprintf("%d Redis keys (a fence counter per lock key ever used)", n), err
		},
		Leftovers: func(ctx context.Context, key string) (int, error) {
			n, err := admin.Exists(ctx, LockKey(key)).Result()
			return int(n), err
		},
	}, admin
}

// ClusterBackend is the suite's description of the lock on a Redis Cluster:
// the lock key, its fence counter and its channel share the hash slot of
// {key}, and the release message reaches a subscriber on any node.
func ClusterBackend(addrs []string) locktest.Backend[Config] {
	// A client per call: a Cluster client's node clients start goroutines
	// lazily, which the suite's leak check would count.
	admin := func(ctx context.Context, do func(*redis.ClusterClient) error) error {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		defer c.Close()
		return do(c)
	}
	return locktest.Backend[Config]{
		Name:   "redis",
		Config: Config{Addr: strings.Join(addrs, ","), TTL: time.Second},
		TTL:    time.Second,
		TakeOver: func(ctx context.Context, key string) (drop func(context.Context) error, err error) {
			err = admin(ctx, func(c *redis.ClusterClient) error { _, err := TakeOver(ctx, c, key); return err })
			drop = func(ctx context.Context) error {
				return admin(ctx, func(c *redis.ClusterClient) error { return c.Del(ctx, LockKey(key)).Err() })
			}
			return drop, err
		},
		Leftovers: func(ctx context.Context, key string) (n int, err error) {
			err = admin(ctx, func(c *redis.ClusterClient) error {
				m, err := c.Exists(ctx, LockKey(key)).Result()
				n = int(m)
				return err
			})
			return n, err
		},
	}
}

// NewLocker opens a client as orderd does and the recipe's Locker with cfg
// on it, both closed when the test ends.
func NewLocker(t *testing.T, addr string, cfg redislock.Config) *redislock.Locker {
	c, err := redisconn.Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	l := redislock.New(c, cfg)
	t.Cleanup(func() { l.Close(); c.Close() })
	return l
}

// BenchLocker opens a plain client and the recipe's Locker with cfg on it,
// both closed when the benchmark ends.
func BenchLocker(b *testing.B, addr string, cfg redislock.Config) *redislock.Locker {
	c := redis.NewClient(&redis.Options{Addr: addr})
	l := redislock.New(c, cfg)
	b.Cleanup(func() { l.Close(); c.Close() })
	return l
}

// CloseEndsWaits checks that Close ends the waits in progress: a waiter
// behind holder's lease returns ErrClosed when its Locker is closed.
func CloseEndsWaits(t *testing.T, holder, waiter *redislock.Locker) {
	t.Helper()
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
