package faults

import "github.com/oversold-lab/oversold/loadtest"

// SlowLockServer puts latency beyond the TTL (2x, each way) on one
// replica's path to its lock server while that replica holds a lease, so
// its renewals time out: the holder must see Lost and abort its critical
// section without writing (REFERENCES.md, "renewals starved"). For backend
// mysql the lock server is MariaDB, so the replica's whole database path
// turns slow; for redis the stock cache shares the path (one setting).
func SlowLockServer() loadtest.Fault {
	return lockPathFault(false, []string{"redis", "redlock", "zookeeper", "mysql", "etcd"})
}
