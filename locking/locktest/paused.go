package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
)

// LostWhenServerPaused checks that a holder cut off from its server cannot
// go on believing it holds the key: with srv (l's only server, private to
// the test) paused, Lost must close by ttl (the lease's or session's, as
// l has it), before the server could expire it and grant the key to
// another; and l must serve again once srv is back.
func LostWhenServerPaused(t *testing.T, srv *testbed.Server, l locking.Locker, ttl time.Duration) {
	t.Helper()
	lease, err := l.Acquire(t.Context(), "sku/paused")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	select {
	case <-lease.Lost():
		took := time.Since(paused)
		t.Logf("Lost closed %v after the server paused (TTL %v)", took.Round(time.Millisecond), ttl)
		// Late is wrong, not slow: the server may grant the key at the TTL.
		if took > ttl+time.Second {
			t.Errorf("Lost closed %v after the server paused, later than the TTL allows", took)
		}
	case <-time.After(ttl + 5*time.Second):
		t.Fatalf("Lost still open %v after the server paused", time.Since(paused))
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// The lease may or may not have expired on the server meanwhile.
	if err := lease.Release(ctx); err != nil && !errors.Is(err, locking.ErrNotHeld) {
		t.Errorf("release after the pause: %v", err)
	}
	again, err := l.Acquire(ctx, "sku/paused")
	if err != nil {
		t.Fatalf("acquire after the server came back: %v", err)
	}
	if err := again.Release(ctx); err != nil {
		t.Error(err)
	}
}
