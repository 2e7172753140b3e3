package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/redlock"
	"github.com/oversold-lab/oversold/locking/redlock/internal/redlocktest"
)

// config is the suite's, shared with the hardening packages' tests.
type config = redlocktest.Config

// open is how the suite opens the recipe alone, here and in its helper
// processes (locking/redlock/fairwake runs it on the composition).
var open = redlocktest.Open(redlock.New)

func TestMain(m *testing.M) { locktest.Main(m, open) }

func TestConformance(t *testing.T) {
	locktest.Run(t, redlocktest.Backend(t, testbed.Redises(t, 3)))
}

func newLocker(tb testing.TB, addrs []string) *redlock.Locker {
	return redlocktest.Locker(tb, redlock.New, addrs, redlock.Config{TTL: 5 * time.Second})
}

// BenchmarkUncontended measures one Acquire and Release of a free key.
func BenchmarkUncontended(b *testing.B) {
	locktest.BenchUncontended(b, newLocker(b, testbed.Redises(b, 3)))
}

// BenchmarkHotKey8 measures handoffs of one key among 8 contenders, each
// with its own Locker and connections, as if in 8 processes: ns/op is the
// time per handoff.
func BenchmarkHotKey8(b *testing.B) {
	addrs := testbed.Redises(b, 3)
	lockers := make([]*redlock.Locker, 8)
	for i := range lockers {
		lockers[i] = newLocker(b, addrs)
	}
	locktest.BenchHotKey(b, lockers)
}

// A minority of nodes down costs nothing; a majority down is ErrUnavailable,
// at once, not after the caller's deadline.
func TestNodesDown(t *testing.T) {
	servers, addrs := redlocktest.OwnRedises(t)
	redlocktest.NoLeaks(t)
	l := redlocktest.Locker(t, redlock.New, addrs, redlock.Config{TTL: time.Second})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	if err := servers[0].Kill(); err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatalf("acquire with one node of three down: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release with one node of three down: %v", err)
	}

	if err := servers[1].Kill(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if lease, err := l.Acquire(ctx, "k"); !errors.Is(err, locking.ErrUnavailable) {
		if err == nil {
			lease.Release(ctx)
		}
		t.Fatalf("acquire with two nodes of three down = %v, want ErrUnavailable", err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("ErrUnavailable came after %v", took)
	}
	if err := l.Ping(ctx); err == nil {
		t.Error("Ping succeeds with two nodes of three down")
	}
}

// An attempt that wins only a minority is undone: with another owner's key
// on nodes 0 and 1, every attempt sets ours on node 2 alone, and the wait
// that ctx ends must leave nothing there (without the undo, node 2 kept the
// key for a TTL).
func TestMinorityUndone(t *testing.T) {
	addrs := testbed.Redises(t, 3)
	admins := redlocktest.Clients(t, addrs)
	l := newLocker(t, addrs)
	const key = "minority"
	lock := redlocktest.LockKey(key)
	for _, c := range admins[:2] {
		if err := c.Set(t.Context(), lock, "rival", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if lease, err := l.Acquire(ctx, key); !errors.Is(err, context.DeadlineExceeded) {
		if err == nil {
			lease.Release(t.Context())
		}
		t.Fatalf("Acquire with two nodes of three held by another owner = %v, want DeadlineExceeded", err)
	}
	// The undo goes on in the background: well within the TTL (5 s).
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n, err := admins[2].Exists(t.Context(), lock).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			pttl, _ := admins[2].PTTL(t.Context(), lock).Result()
			t.Fatalf("node 2 keeps the key of an attempt that got no majority (PTTL %v)", pttl)
		}
	}
}
