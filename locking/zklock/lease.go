package zklock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/locking"
)

// lease is one node of ours at the head of its queue.
type lease struct {
	locker     *Locker
	key        string
	path       string
	session    int64 // the session that owns the node
	token      uint64
	dog        Watchdog
	released   atomic.Bool
	watchTimer *time.Timer // sets the watch on our node after watchDelay
}

func (s *lease) Key() string           { return s.key }
func (s *lease) Token() uint64         { return s.token }
func (s *lease) Lost() <-chan struct{} { return s.dog.Lost() }

// grant makes our node, first in the listing that read pzxid (the token),
// a lease valid from sent. It costs no request.
func (l *Locker) grant(key, path string, session int64, sent time.Time, pzxid int64) (*lease, error) {
	s := &lease{locker: l, key: key, path: path, session: session, token: uint64(pzxid)}
	s.dog = l.cfg.Watchdog(key, trusted(l.SessionTimeout()), sent, s.check)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		s.dog.Stop()
		return nil, errClosed
	}
	l.leases[path] = s
	l.mu.Unlock()
	if l.conn.SessionID() != s.session { // registered first: no expiry slips by
		s.dog.MarkLost()
	}
	s.watchTimer = time.AfterFunc(watchDelay, s.watch)
	return s, nil
}

// watchDelay is how long a lease is held before it watches its own node:
// most leases of a hot key are released sooner, and cost no watch.
const watchDelay = 20 * time.Millisecond

// watch sets a watch on our node, whose deletion onEvent turns into Lost;
// a node already gone is lost at once. Nothing once Release began.
func (s *lease) watch() {
	l := s.locker
	l.Go(func() {
		if s.released.Load() {
			return
		}
		_, _, _, err := l.conn.GetW(s.path)
		if errors.Is(err, zk.ErrNoNode) && !s.released.Load() {
			s.dog.MarkLost()
		}
		// Any other failure: the watchdog's checks decide.
	})
}

// trusted is how long a confirmed check vouches for the session: the
// leader may count from the check before ours (docs/locks/zklock.md).
func trusted(timeout time.Duration) time.Duration { return timeout * 2 / 3 }

// check is the watchdog's renewal: our node is still our session's, as
// the leader has it (a partitioned follower serves reads, but cannot sync).
func (s *lease) check(ctx context.Context) error {
	l := s.locker
	if _, err := l.conn.Sync(s.path); err != nil {
		return err
	}
	ok, st, err := l.conn.Exists(s.path)
	if err == nil && (!ok || st.EphemeralOwner != s.session) {
		err = locking.ErrNotHeld
	}
	return err
}

// Release deletes our node; its name is ours alone, so a retry is safe.
func (s *lease) Release(ctx context.Context) error {
	notHeld := fmt.Errorf("release %q: %w", s.key, locking.ErrNotHeld)
	if !s.released.CompareAndSwap(false, true) {
		return notHeld
	}
	l := s.locker
	l.mu.Lock()
	closed := l.closed
	delete(l.leases, s.path) // before the delete, so its event is not a loss
	l.mu.Unlock()
	if closed {
		return notHeld // Close ended the session and deleted the node
	}
	// Lost before: not held, even if a retry finds the node gone.
	var lostBefore bool
	select {
	case <-s.dog.Lost():
		lostBefore = true
	default:
	}
	s.dog.Stop()
	s.watchTimer.Stop()
	for try := 0; ; try++ {
		err := zk.ErrNoNode // a new session: our node died with the old one
		if l.conn.SessionID() == s.session {
			err = l.conn.Delete(s.path, -1)
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, zk.ErrNoNode):
			if try > 0 && !lostBefore {
				return nil // our first delete landed, or the expiry: gone either way
			}
			s.dog.MarkLost()
			return notHeld
		case ctx.Err() != nil, try == Tries-1, errors.Is(err, zk.ErrClosing), !l.Sleep(ctx, Backoff(try)):
			// Else retry. Here stop waiting, not deleting: a node left holds the key.
			l.Remove(s.path, s.session)
			return s.releaseFailed(err)
		}
	}
}

// releaseFailed: not held if lost already, else the lease's fate is unknown.
func (s *lease) releaseFailed(err error) error {
	cause := locking.ErrUnavailable
	select {
	case <-s.dog.Lost():
		cause = locking.ErrNotHeld
	default:
	}
	return fmt.Errorf("release %q: %w: %w", s.key, cause, err)
}
