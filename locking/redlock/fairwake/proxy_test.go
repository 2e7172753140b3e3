package fairwake_test

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/redlock"
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
// deadlines bound each request; quorum and fairwake).
func proxiedLocker(tb testing.TB, addrs []string, cfg redlock.Config) *redlock.Locker {
	var cs []redis.UniversalClient
	for _, a := range addrs {
		c, err := redisconn.Open(a)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	l, err := backends.NewRedlock(cs, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}
