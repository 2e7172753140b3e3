// Package faults holds the lab's fault scenarios: each disturbs one run of
// the experiment (a paused lock holder, a restarted Redis, a slow network)
// so the report can show which guard keeps the invariants when a lease lock
// has two holders at once.
package faults

import "github.com/oversold-lab/oversold/loadtest"

// All is every scenario by the name the lab's --fault flag takes.
func All() map[string]loadtest.Fault {
	return map[string]loadtest.Fault{
		"pause-holder":          PauseHolder(),
		"pause-after-commit":    PauseAfterCommit(),
		"kill-holder":           KillHolder(),
		"mysql-connection-kill": MySQLConnectionKill(),
		"crash-after-commit":    CrashAfterCommit(),
		"queue-consumer-kill":   QueueConsumerKill(),
		// The accept queue's Redis restarted, without persistence and
		// with every write fsynced (--accept queue).
		"queue-redis-restart":       QueueRedisRestart(false),
		"queue-redis-restart-fsync": QueueRedisRestart(true),
		// Server and network faults.
		"slow-lock-server":             SlowLockServer(),
		"delayed-write":                DelayedWrite(),
		"redis-restart":                RedisRestart(),
		"redis-failover":               RedisFailover(),
		"redlock-node-restart":         RedlockNodeRestart(),
		"redlock-node-restart-delayed": RedlockNodeRestartDelayed(),
		"zk-session-expiry":            ZKSessionExpiry(),
		"etcd-lease-expiry":            EtcdLeaseExpiry(),
		// Cluster faults: each run gets a cluster of its own.
		"zk-leader-kill":         ZKLeaderKill(),
		"etcd-leader-kill":       EtcdLeaderKill(),
		"redis-cluster-failover": RedisClusterFailover(),
		"zk-follower-partition":  ZKFollowerPartition(),
		// Reservations' faults: --workload reservations.
		"reservation-sweeper-pause":   ReservationSweeperPause(),
		"reservation-kill-after-hold": ReservationKillAfterHold(),
		"reservation-expiry-race":     ReservationExpiryRace(),
	}
}
