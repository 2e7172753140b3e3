package fairwake_test

import (
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/redlock"
	"github.com/oversold-lab/oversold/locking/redlock/internal/redlocktest"
)

// config is the suite's, shared with the recipe's tests.
type config = redlocktest.Config

// open is how the suite opens the composition orderd runs (the recipe with
// quorum and fairwake), here and in its helper processes.
var open = redlocktest.Open(backends.NewRedlock)

func TestMain(m *testing.M) { locktest.Main(m, open) }

func TestConformance(t *testing.T) {
	addrs := testbed.Redises(t, 3)
	b := redlocktest.Backend(t, addrs)
	b.QueueConfig = &config{Addrs: addrs, TTL: time.Minute, FallbackWait: 10 * time.Minute, NodeTimeout: redlocktest.ConformanceNodeTimeout}
	// And the queue entries and liveness of waiters, on any node.
	b.Leftovers = redlocktest.Leftovers(redlocktest.Clients(t, addrs), ":waiters", ":alive")
	locktest.Run(t, b)
}

func newLocker(tb testing.TB, addrs []string) *redlock.Locker {
	return redlocktest.Locker(tb, backends.NewRedlock, addrs, redlock.Config{TTL: 5 * time.Second})
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

// A waiter must be woken by the release message, not by its fallback timer:
// with the timer and the holder's TTL far away, only the message is quick.
func TestReleaseWakesWaiter(t *testing.T) {
	addrs := testbed.Redises(t, 3)
	redlocktest.NoLeaks(t)
	cfg := redlock.Config{TTL: time.Minute, MinBackoff: time.Minute, MaxBackoff: time.Minute}
	holder := redlocktest.Locker(t, backends.NewRedlock, addrs, cfg)
	waiter := redlocktest.Locker(t, backends.NewRedlock, addrs, cfg)
	locktest.ReleaseWakesWaiter(t, holder, waiter)
}

// A woken waiter keeps its place: newcomers do not jump the queue.
func TestFairHandoff(t *testing.T) {
	addrs := testbed.Redises(t, 3)
	locktest.FairHandoff(t, locktest.Backend[config]{Name: "redlock", Config: config{Addrs: addrs, TTL: 10 * time.Second}, TTL: 10 * time.Second}, 6, 300)
}
