package etcdlock_test

import (
	"context"
	"testing"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
)

// The recipe as locking/backends composes it for orderd and the lab, with
// the hardening packages beside it: it passes the same suite.

func openHardened(ctx context.Context, c config) (locking.Locker, error) {
	return backends.Open(ctx, "etcd", backends.Config{EtcdEndpoints: c.Endpoints, TTL: c.TTL})
}

func TestConformanceHardened(t *testing.T) { conformance(t, testbed.Etcd(t), true) }

func TestConformanceClusterHardened(t *testing.T) { conformance(t, testbed.EtcdCluster(t), true) }

func BenchmarkAcquireReleaseHardened(b *testing.B) {
	acquireRelease(b, hardened(b, testbed.Etcd(b)))
}

func BenchmarkHotKeyHardened(b *testing.B) {
	endpoints := testbed.Etcd(b)
	hotKey(b, func() locking.Locker { return hardened(b, endpoints) })
}

func hardened(tb testing.TB, endpoints []string) locking.Locker {
	tb.Helper()
	l, err := openHardened(tb.Context(), config{Endpoints: endpoints, TTL: ttl})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}
