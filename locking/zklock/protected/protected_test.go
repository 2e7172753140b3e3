package protected_test

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/zklock"
)

// config is what the suite opens a Locker from.
type config struct {
	Servers []string
	TTL     time.Duration // the session timeout
}

// open is the hardened composition orderd and the lab run: the recipe with
// this package's create, the shared watchdog, handover and the identity.
func open(ctx context.Context, c config) (locking.Locker, error) {
	return backends.Open(ctx, "zookeeper", backends.Config{ZKServers: c.Servers, TTL: c.TTL})
}

func TestMain(m *testing.M) { locktest.Main(m, open) }

// ttl is the session timeout for the suite: short, yet safe from spurious
// expiry on a busy 2-core machine under -race.
const ttl = 2 * time.Second

// The suite on the composition backends.Open makes, on one server and on
// a three-node ensemble.
func TestConformance(t *testing.T)         { conformance(t, testbed.ZooKeeper(t)) }
func TestConformanceEnsemble(t *testing.T) { conformance(t, testbed.ZooKeeperEnsemble(t)) }

func conformance(t *testing.T, servers []string) {
	locktest.Run(t, locktest.Backend[config]{
		Name:   "zookeeper",
		Config: config{Servers: servers, TTL: ttl},
		TTL:    ttl,
		// Replace the holder's node (the lowest in the key's queue) with a
		// rival's persistent one, which then holds the key.
		TakeOver: func(ctx context.Context, key string) (func(context.Context) error, error) {
			var rival string
			err := withConn(ctx, servers, func(c *zk.Conn) error {
				queue, err := children(c, key)
				if err != nil {
					return err
				}
				if len(queue) == 0 {
					return errors.New("no holder to take over from")
				}
				if err := c.Delete(parent(key)+"/"+queue[0], -1); err != nil {
					return err
				}
				rival, err = c.Create(parent(key)+"/_c_rival-lock-", nil, zk.FlagSequence, zk.WorldACL(zk.PermAll))
				return err
			})
			return func(ctx context.Context) error {
				return withConn(ctx, servers, func(c *zk.Conn) error { return c.Delete(rival, -1) })
			}, err
		},
		QueueConfig: &config{Servers: servers, TTL: ttl},
		Leftovers:   queueLength(servers),
		Servers:     servers,
		Through:     func(addrs []string) config { return config{Servers: addrs, TTL: ttl} },
		Expiry:      ttl,
	})
}

// parent is the key's queue node, as zklock names it.
func parent(key string) string {
	return zklock.DefaultRoot + "/" + strings.ReplaceAll(url.PathEscape(key), ".", "%2E")
}

// children lists the key's queue, lowest sequence first.
func children(c *zk.Conn, key string) ([]string, error) {
	names, _, err := c.Children(parent(key))
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	slices.SortFunc(names, func(a, b string) int {
		return strings.Compare(a[strings.LastIndex(a, "-"):], b[strings.LastIndex(b, "-"):])
	})
	return names, err
}

// queueLength counts the nodes in a key's queue (holder and waiters).
func queueLength(servers []string) func(ctx context.Context, key string) (int, error) {
	return func(ctx context.Context, key string) (n int, err error) {
		err = withConn(ctx, servers, func(c *zk.Conn) error {
			queue, err := children(c, key)
			n = len(queue)
			return err
		})
		return n, err
	}
}

// withConn runs f on a fresh connection, closed before it returns.
func withConn(ctx context.Context, servers []string, f func(*zk.Conn) error) error {
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

// eventually polls ok every 20 ms for up to 10 s, and says whether it held.
func eventually(ok func() bool) bool {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if ok() {
			return true
		}
	}
	return ok()
}
