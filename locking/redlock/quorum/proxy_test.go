package quorum_test

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/redlock"
	"github.com/oversold-lab/oversold/locking/redlock/fairwake"
)

// proxied puts a proxy in front of each address.
func proxied(tb testing.TB, addrs []string) ([]string, testbed.Proxies) {
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

// proxiedLocker opens its clients and the Locker as orderd does (ctx
// deadlines bound each request; quorum and fairwake). With waitAll, it
// leaves quorum out: the recipe's Fanout waits for every node, the broken
// variant the quorum tests must catch.
func proxiedLocker(tb testing.TB, addrs []string, cfg redlock.Config, waitAll bool) *redlock.Locker {
	var cs []redis.UniversalClient
	for _, a := range addrs {
		c, err := redisconn.Open(a)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	newLocker := backends.NewRedlock
	if waitAll {
		newLocker = func(cs []redis.UniversalClient, cfg redlock.Config) (*redlock.Locker, error) {
			cfg.Queue = fairwake.New(cs)
			return redlock.New(cs, cfg)
		}
	}
	l, err := newLocker(cs, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

func TestMain(m *testing.M) { testbed.Main(m) }

func clients(tb testing.TB, addrs []string) []redis.UniversalClient {
	var cs []redis.UniversalClient
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		tb.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs
}
