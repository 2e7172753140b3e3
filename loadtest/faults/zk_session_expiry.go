package faults

import "github.com/oversold-lab/oversold/loadtest"

// ZKSessionExpiry cuts the lock holder off from ZooKeeper (a blackhole on
// its path) past its session timeout, then heals the path. The server
// expires the session and deletes the holder's ephemeral node, so the next
// waiter gets the lock; the holder's Lost closed before that (no request
// succeeded for a session timeout), and it aborts. Curator's tech note 10 is
// the case where the holder does not look: a 10 s pause against a 3 s
// session leaves two clients that both believe they hold the lock.
func ZKSessionExpiry() loadtest.Fault {
	return lockPathFault(true, []string{"zookeeper"})
}

// EtcdLeaseExpiry is the etcd analogue: the holder cut off from etcd past
// its lease TTL, then healed.
func EtcdLeaseExpiry() loadtest.Fault {
	return lockPathFault(true, []string{"etcd"})
}
