// Package etcdlocktest is test wiring, imported only by _test files: what
// the tests of the recipe (locking/etcdlock) and of its hardening packages
// (lostrevoke, namereuse, quickwake) share to reach a real etcd. A team
// copying the recipe copies etcdlock_test.go with this package (or inlines
// the two helpers).
package etcdlocktest

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Client opens a client of endpoints, closed when the test ends.
func Client(tb testing.TB, endpoints []string) *clientv3.Client {
	tb.Helper()
	cli, err := newClient(endpoints)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// WithClient runs f on a fresh client, closed before it returns, so no
// goroutine of it outlives the call.
func WithClient(endpoints []string, f func(*clientv3.Client) error) error {
	c, err := newClient(endpoints)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

func newClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}
