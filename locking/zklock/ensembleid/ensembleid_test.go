package ensembleid_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/zklock"
	"github.com/oversold-lab/oversold/locking/zklock/ensembleid"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// open is a recipe Locker with its Identity, closed when t ends.
func open(t *testing.T, addr, root string) locking.Locker {
	l, err := zklock.New(t.Context(), []string{addr}, zklock.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return ensembleid.With(l, l)
}

// TestIdentity: locktest.Identity on ZooKeeper; a new ensemble (whose
// zxids may be below the old one's) gives a new identity.
// The Root does not exist before the first call.
func TestIdentity(t *testing.T) {
	t.Parallel()
	root := "/" + testbed.Prefix(t) + "/locks"
	locktest.Identity(t, testbed.StartZooKeeper, testbed.Options{}, func(t *testing.T, addr string) locking.Locker {
		return open(t, addr, root)
	})
}

// TestIdentityUnavailable: a ZooKeeper that does not answer (paused) makes
// Identity fail with ErrUnavailable once ctx ends, which orderd reports as
// the setting naming the servers (before, it returned the bare
// context error, and orderd exited 1 without naming it).
func TestIdentityUnavailable(t *testing.T) {
	t.Parallel()
	srv := locktest.PrivateServer(t, testbed.StartZooKeeper)
	l := open(t, srv.Addr, "/"+testbed.Prefix(t)+"/locks")
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := locking.IdentityOf(ctx, l)
	if !errors.Is(err, locking.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Identity on a paused server: %v; want ErrUnavailable and the deadline", err)
	}
}
