package protected_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/zklock"
	"github.com/oversold-lab/oversold/locking/zklock/internal/zklocktest"
	"github.com/oversold-lab/oversold/locking/zklock/protected"
)

// The session that owns a queue node is the one the connection had when
// the create was sent. Here the session expires after the create answered
// and before the Locker looks at its session (the connection goes silent,
// the server expires the session and deletes the node, the client comes
// back with a new session): Create must not take the dead node for the
// new session's, or a lease granted on it, from a listing by a follower
// that still shows the node, would pass its session check while the node
// is gone. Before the fix Create reported the node as the new session's.
func TestSessionChangeAfterCreate(t *testing.T) {
	servers := testbed.ZooKeeper(t)
	var s zklocktest.Silencer
	key := testbed.Prefix(t) + "/expired"
	var fired atomic.Bool
	var old int64
	var l *zklock.Locker
	create := protected.Creator{AfterCreate: func(path string) {
		if !fired.CompareAndSwap(false, true) {
			return
		}
		old = l.Conn().SessionID()
		s.Cut()
		gone := eventually(func() bool {
			var exists bool
			err := withConn(t.Context(), servers, func(c *zk.Conn) (err error) {
				exists, _, err = c.Exists(path)
				return err
			})
			return err == nil && !exists
		})
		s.Restore()
		if !gone {
			t.Error("the server kept the node of a session silent for 10 s")
			return
		}
		if !eventually(func() bool { id := l.Conn().SessionID(); return id != 0 && id != old }) {
			t.Error("the Locker got no new session within 10 s")
		}
	}}
	l, err := zklock.New(t.Context(), servers, zklock.Config{SessionTimeout: time.Second, Dialer: s.Dial, Create: create.Create})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	path, session, err := create.Create(l, parent(key))
	if !fired.Load() {
		t.Fatal("the session was not expired after the create: the test proves nothing")
	}
	if err == nil {
		var st *zk.Stat
		var exists bool
		if err := withConn(ctx, servers, func(c *zk.Conn) (err error) {
			exists, st, err = c.Exists(path)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		switch {
		case !exists:
			t.Fatalf("Create took %s for session 0x%x's, but it died with session 0x%x, expired after the create", path, session, old)
		case st.EphemeralOwner != session:
			t.Fatalf("Create took %s for session 0x%x's, but session 0x%x owns it", path, session, st.EphemeralOwner)
		}
	}
	t.Logf("Create after the session changed: %v", err)
	// The Locker serves on its new session, and leaves nothing behind.
	lease, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !eventually(func() bool { n, err := queueLength(servers)(ctx, key); return err == nil && n == 0 }) {
		t.Error("nodes left in the queue after the release")
	}
}
