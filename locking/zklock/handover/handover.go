// Package handover lets a caller of a zklock Locker stop waiting at once,
// even in the middle of a request. go-zookeeper's requests take no context:
// the recipe notices a ctx that ended only between requests, so an Acquire
// or Release cut off from ZooKeeper waits until the client gives the
// request up (2/3 of the session timeout). Here each Acquire and Release
// runs on a goroutine of a shared group (locking/internal/background, which
// reuses them), and the caller waits for it or its ctx, whichever comes
// first. What the goroutine goes on with is the recipe's own cleanup, and a
// grant that comes as the caller gives up is released: nobody holds it.
package handover

import (
	"context"
	"fmt"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/internal/background"
	"github.com/oversold-lab/oversold/locking/zklock"
)

// Locker is a zklock Locker whose callers stop waiting when their ctx ends.
type Locker struct {
	*zklock.Locker
	g *background.Group
}

var errClosed = fmt.Errorf("zklock: locker closed: %w", locking.ErrUnavailable)

// New wraps l, which its Close closes.
func New(l *zklock.Locker) *Locker { return &Locker{Locker: l, g: background.New()} }

// Close closes the recipe's Locker, whose requests under way then fail, and
// waits for the goroutines that ran them.
func (h *Locker) Close() error {
	h.g.Close()
	err := h.Locker.Close()
	h.g.Wait()
	return err
}

// Acquire runs the recipe's Acquire on the group.
func (h *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, locking.AcquireError(ctx, key, err)
	}
	type result struct {
		s   locking.Lease
		err error
	}
	res := make(chan result) // unbuffered: handed only to a caller still waiting
	if !h.g.Go(func() {
		s, err := h.Locker.Acquire(ctx, key)
		select {
		case res <- result{s, err}:
		case <-ctx.Done():
			if s != nil { // granted as the caller gave up: nobody holds it
				rctx, cancel := context.WithTimeout(context.Background(), h.SessionTimeout())
				s.Release(rctx)
				cancel()
			}
		}
	}) {
		return nil, locking.AcquireError(ctx, key, errClosed)
	}
	select {
	case r := <-res:
		if r.err != nil {
			return nil, r.err
		}
		return lease{Lease: r.s, g: h.g}, nil
	case <-ctx.Done():
		return nil, locking.AcquireError(ctx, key, ctx.Err())
	}
}

type lease struct {
	locking.Lease
	g *background.Group
}

// Release runs the recipe's Release on the group. When ctx ends first, the
// recipe's Release sees it too, and leaves the delete to its background.
func (s lease) Release(ctx context.Context) error {
	res := make(chan error, 1)
	if !s.g.Go(func() { res <- s.Lease.Release(ctx) }) {
		return s.Lease.Release(ctx) // closing: the recipe answers at once
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		cause := locking.ErrUnavailable // its fate is unknown
		select {
		case <-s.Lost():
			cause = locking.ErrNotHeld
		default:
		}
		return fmt.Errorf("release %q: %w: %w", s.Key(), cause, ctx.Err())
	}
}
