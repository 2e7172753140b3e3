// Package zklocktest is test wiring, imported only by _test files: what
// the tests of the recipe (locking/zklock) and of its hardening packages
// (protected, handover, ensembleid) share to run the conformance suite and
// their own tests on a real ZooKeeper. A team copying the recipe copies
// zklock_test.go with this package (or inlines the few helpers it uses).
package zklocktest

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/zklock"
)

// Config is what the suite opens a Locker from.
type Config struct {
	Servers []string
	TTL     time.Duration // the session timeout
}

// TTL is the session timeout for the suite: short, yet safe from spurious
// expiry on a busy 2-core machine under -race.
const TTL = 2 * time.Second

// Backend is the suite's description of the lock on the ZooKeeper servers
// given. TakeOver replaces the holder's node (the lowest in the key's
// queue) with a rival's persistent one, which then holds the key;
// Leftovers counts the key's queue.
func Backend(servers []string) locktest.Backend[Config] {
	return locktest.Backend[Config]{
		Name:   "zookeeper",
		Config: Config{Servers: servers, TTL: TTL},
		TTL:    TTL,
		TakeOver: func(ctx context.Context, key string) (func(context.Context) error, error) {
			var rival string
			err := WithConn(ctx, servers, func(c *zk.Conn) error {
				queue, err := Children(c, key)
				if err != nil {
					return err
				}
				if len(queue) == 0 {
					return errors.New("no holder to take over from")
				}
				if err := c.Delete(Parent(key)+"/"+queue[0], -1); err != nil {
					return err
				}
				rival, err = c.Create(Parent(key)+"/_c_rival-lock-", nil, zk.FlagSequence, zk.WorldACL(zk.PermAll))
				return err
			})
			return func(ctx context.Context) error {
				return WithConn(ctx, servers, func(c *zk.Conn) error { return c.Delete(rival, -1) })
			}, err
		},
		QueueConfig: &Config{Servers: servers, TTL: TTL},
		Leftovers:   QueueLength(servers),
		Servers:     servers,
		Through:     func(addrs []string) Config { return Config{Servers: addrs, TTL: TTL} },
		Expiry:      TTL,
	}
}

// Parent is the key's queue node, as zklock names it.
func Parent(key string) string {
	return zklock.DefaultRoot + "/" + strings.ReplaceAll(url.PathEscape(key), ".", "%2E")
}

// Children lists the key's queue, lowest sequence first.
func Children(c *zk.Conn, key string) ([]string, error) {
	names, _, err := c.Children(Parent(key))
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	slices.SortFunc(names, func(a, b string) int {
		return strings.Compare(a[strings.LastIndex(a, "-"):], b[strings.LastIndex(b, "-"):])
	})
	return names, err
}

// QueueLength counts the nodes in a key's queue (holder and waiters).
func QueueLength(servers []string) func(ctx context.Context, key string) (int, error) {
	return func(ctx context.Context, key string) (n int, err error) {
		err = WithConn(ctx, servers, func(c *zk.Conn) error {
			queue, err := Children(c, key)
			n = len(queue)
			return err
		})
		return n, err
	}
}

// WithConn runs f on a fresh connection, closed before it returns, so no
// goroutine of it outlives the call.
func WithConn(ctx context.Context, servers []string, f func(*zk.Conn) error) error {
	c, events, err := zk.Connect(servers, 5*time.Second, zk.WithLogInfo(false))
	if err != nil {
		return err
	}
	defer func() {
		c.Close()
		for range events {
		}
	}()
	for c.State() != zk.StateHasSession {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return f(c)
}

// Eventually polls ok every 20 ms for up to 10 s, and says whether it held.
func Eventually(ok func() bool) bool {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if ok() {
			return true
		}
	}
	return ok()
}
