package zklock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/zklock"
	"github.com/oversold-lab/oversold/locking/zklock/internal/zklocktest"
)

// After its session expires, go-zookeeper has no session (SessionID is 0)
// until it makes a new one, and sends the requests queued meanwhile on the
// new one. A create sent in that gap makes a node the new session owns: the
// recipe must not take it for another session's, or the lease is lost at
// once, its Release deletes nothing, and the node, kept alive by the new
// session, blocks the key for the Locker's lifetime.
func TestCreateSentBetweenSessions(t *testing.T) {
	servers := testbed.ZooKeeper(t)
	key, marker := testbed.Prefix(t)+"/between", testbed.Prefix(t)+"/marker"
	var s zklocktest.Silencer
	var between atomic.Bool // a create was sent while the client had no session
	l, err := zklock.New(t.Context(), servers, zklock.Config{SessionTimeout: time.Second, Dialer: s.Dial,
		Create: func(l *zklock.Locker, parent string) (string, int64, error) {
			if l.SessionID() == 0 {
				between.Store(true)
			}
			return zklock.CreateOnce(l, parent)
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	other, err := zklock.New(t.Context(), servers, zklock.Config{SessionTimeout: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// A lease on marker: its node goes when the server expires the session.
	if _, err := l.Acquire(ctx, marker); err != nil {
		t.Fatal(err)
	}
	// other holds the key, so its parent is there: our create is the first
	// request sent on the new session, not a MakePath.
	first, err := other.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	s.Cut()
	waitFor(t, func() bool { n, err := queueLength(servers)(ctx, marker); return err == nil && n == 0 })
	s.Restore()
	for l.SessionID() != 0 {
		if ctx.Err() != nil {
			t.Fatal("the client never noticed its session expired")
		}
		time.Sleep(100 * time.Microsecond)
	}
	// Past go-zookeeper's flush of unsent requests (they fail with
	// ErrNoServer), inside its 1 s pause before it dials again.
	time.Sleep(200 * time.Millisecond)
	type result struct {
		lease locking.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctx, key)
		got <- result{lease, err}
	}()
	waitFor(t, func() bool { n, err := queueLength(servers)(ctx, key); return err == nil && n == 2 })
	if !between.Load() {
		t.Fatal("no create was sent between the sessions: the test proves nothing")
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	lease := r.lease
	select {
	case <-lease.Lost():
		t.Error("the lease was lost at once")
	default:
	}
	if err := lease.Release(ctx); err != nil {
		t.Error(err)
	}
	octx, ocancel := context.WithTimeout(ctx, 5*time.Second)
	defer ocancel()
	ol, err := other.Acquire(octx, key)
	if err != nil {
		t.Fatalf("another Locker cannot take the key once it was released: %v", err)
	}
	ol.Release(ctx)
}
