package etcdlock_test

import (
	"testing"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
)

// TestIdentity: locktest.Identity on etcd; a new cluster (whose revisions
// start again from 1) gives a new identity.
func TestIdentity(t *testing.T) {
	t.Parallel()
	locktest.Identity(t, testbed.StartEtcd, testbed.Options{}, func(t *testing.T, addr string) locking.Locker {
		return newLocker(t, []string{addr})
	})
}
