package zklock

import (
	"context"
	"testing"
)

// Escape is the key-to-node-name mapping, for the tests' Steal and Leftovers.
var Escape = escape

// SessionID is the Locker's session, for the tests that read the server's
// per-connection figures.
func (l *Locker) SessionID() int64 { return l.conn.SessionID() }

// AfterCreate runs f where create has its node and is about to check that
// the node's session is still the connection's, until tb ends.
func AfterCreate(tb testing.TB, f func(path string)) {
	afterCreate.Store(&f)
	tb.Cleanup(func() { afterCreate.Store(nil) })
}

// Enqueue queues for key as Acquire does, and returns the node's path and
// the session the Locker takes for its owner.
func (l *Locker) Enqueue(ctx context.Context, key string) (string, int64, error) {
	return l.enqueue(ctx, l.cfg.Root+"/"+escape(key))
}
