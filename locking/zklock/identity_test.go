package zklock_test

import (
	"testing"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/zklock"
)

// TestIdentity: locktest.Identity on ZooKeeper; a new ensemble (whose
// zxids may be below the old one's: review-5 R5-3) gives a new identity.
// The Root does not exist before the first call.
func TestIdentity(t *testing.T) {
	t.Parallel()
	root := "/" + testbed.Prefix(t) + "/locks"
	locktest.Identity(t, testbed.StartZooKeeper, testbed.Options{}, func(t *testing.T, addr string) locking.Locker {
		l, err := zklock.New(t.Context(), []string{addr}, zklock.Config{Root: root})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	})
}
