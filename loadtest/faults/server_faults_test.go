package faults_test

import (
	"testing"

	"github.com/oversold-lab/oversold/loadtest"
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
			assertFired(t, r)
			assertSafe(t, r)
			if r.LeasesLost == 0 {
				t.Errorf("no lease lost: %v", r.FaultEvents)
			}
		})
	}
}

// TestDelayedWrite: the holder's write, sent past its one Lost check,
// reaches MariaDB after its lease ended and a second holder wrote. Guard
// none loses an update; guards fencing and version refuse the late write.
func TestDelayedWrite(t *testing.T) {
	for _, guard := range []string{"none", "fencing", "version"} {
		t.Run("redis/"+guard, func(t *testing.T) {
			r := runFault(t, short("delayed-write", "redis", guard))
			assertFired(t, r)
			if guard == "none" {
				// No overlap is asserted: the holder's own record ends when
				// its watchdog saw the lease lost, before the second
				// holder's grant; its write was already on the wire.
				if r.Oversold == 0 && r.LostUpdates == 0 {
					t.Errorf("%s: %s; want the late write to lose an update (%v)", r.Name(), r.Verdict(), r.FaultEvents)
				}
				return
			}
			assertSafe(t, r)
			assertRefused(t, r)
		})
	}
}

// TestRedisRestart: a lock Redis restarted empty makes two holders; its
// fencing counter starts again below MySQL's fence, which refuses it.
func TestRedisRestart(t *testing.T) {
	t.Run("redis/none", func(t *testing.T) {
		r := runFault(t, short("redis-restart", "redis", "none"))
		assertFired(t, r)
		assertBroken(t, r)
	})
	t.Run("redis/fencing", func(t *testing.T) {
		r := runFault(t, short("redis-restart", "redis", "fencing"))
		assertFired(t, r)
		assertSafe(t, r)
		assertRefused(t, r)
	})
}

// TestRedisFailover: replication cut by its ACL user, a lock taken on the
// master, the master killed, the replica promoted: a second replica takes
// the same lock there while the first still holds it, every time, whatever
// the guard (the two holders this fault must show). Guard none loses an
// update; fencing refuses the promoted replica's repeated tokens and
// version the stale write, and both keep every invariant.
func TestRedisFailover(t *testing.T) {
	needServers(t, "sentinel")
	for _, guard := range []string{"none", "fencing", "version"} {
		t.Run("redis/"+guard, func(t *testing.T) {
			// A light load: the fault drives its own orders, and a load
			// holder whose release dies with the master leaves its key on
			// the promoted replica for the 30 s TTL, which only makes the
			// rest of the load wait out its lock timeouts.
			spec := short("redis-failover", "redis", guard)
			spec.Requests, spec.Rate = 20, 100
			r := runFault(t, spec)
			assertFired(t, r)
			if guard == "none" {
				assertBroken(t, r) // two holders, and a lost update
				return
			}
			if r.Overlaps == 0 {
				t.Errorf("%s: no two holders overlapped: %v", r.Name(), r.FaultEvents)
			}
			assertSafe(t, r)
			assertRefused(t, r)
		})
	}
}

// TestGateFailover: the same failover without a lock strikes the stock
// gate's Redis: the promoted replica never saw what was sold after the cut
// and admits orders for stock that is gone. The peers' trusting
// configuration (guard none) sells it; guard atomic refuses it in MySQL.
func TestGateFailover(t *testing.T) {
	needServers(t, "sentinel")
	for _, guard := range []string{"none", "atomic"} {
		t.Run("none/"+guard+"+gate", func(t *testing.T) {
			spec := short("redis-failover", "none", guard)
			spec.Gate = "redis"
			spec.Requests, spec.Rate = 20, 100
			r := runFault(t, spec)
			assertFired(t, r)
			if guard == "none" {
				if r.Oversold == 0 {
					t.Errorf("%s: %s; want the promoted gate to oversell (%v)", r.Name(), r.Verdict(), r.FaultEvents)
				}
				return
			}
			assertSafe(t, r)
		})
	}
}

// TestRedlockNodeRestart: a granting node restarted at once makes a second
// majority (the two holders this fault must show); guard version keeps the
// invariants; the delayed restart (the control) makes no overlap at all.
func TestRedlockNodeRestart(t *testing.T) {
	t.Run("redlock/none", func(t *testing.T) {
		r := runFault(t, shortRedlock("redlock-node-restart", "none"))
		assertFired(t, r)
		assertBroken(t, r)
	})
	t.Run("redlock/version", func(t *testing.T) {
		r := runFault(t, shortRedlock("redlock-node-restart", "version"))
		assertFired(t, r)
		assertSafe(t, r)
		assertRefused(t, r)
	})
	t.Run("redlock/none/delayed", func(t *testing.T) {
		r := runFault(t, shortRedlock("redlock-node-restart-delayed", "none"))
		assertFired(t, r)
		assertSafe(t, r)
		if r.Overlaps != 0 {
			t.Errorf("%d overlaps with a restart delayed past the TTL, want 0: %v", r.Overlaps, r.FaultEvents)
		}
	})
}

// shortRedlock is short with a lighter load: Redlock's acquire retries make
// a hot key slow, and the fault drives its own orders anyway.
func shortRedlock(fault, guard string) loadtest.Spec {
	spec := short(fault, "redlock", guard)
	spec.Requests, spec.Rate = 20, 100
	return spec
}

// TestLockServerCut: the holder cut off from ZooKeeper past its session
// timeout (from etcd past its lease TTL) sees Lost and does not write.
func TestLockServerCut(t *testing.T) {
	for _, tc := range []struct{ fault, backend string }{{"zk-session-expiry", "zookeeper"}, {"etcd-lease-expiry", "etcd"}} {
		t.Run(tc.fault+"/"+tc.backend+"/none", func(t *testing.T) {
			r := runFault(t, short(tc.fault, tc.backend, "none"))
			assertFired(t, r)
			assertSafe(t, r)
			if r.LeasesLost == 0 {
				t.Errorf("no lease lost: %v", r.FaultEvents)
			}
		})
	}
}
