package fairqueue

import (
	"context"
	"fmt"
	"time"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/internal/waitq"
	"github.com/oversold-lab/oversold/locking/redislock"
)

// turn is one Acquire's place in the queue, across its tries.
type turn struct {
	q       *queue
	n       waitq.Names
	owner   string
	member  string // our place in the queue
	channel string
	nt      *waitq.Notifier
	w       *waitq.Waiter
	timer   *time.Timer
	repick  bool   // the last wait ended with no wake-up
	moved   bool   // the last wait's node no longer serves the slot
	movedTo string // where the MOVED said it went, if it named a node
	// From the last refused try: the fence counter it saw, the waiters
	// ahead, and when it was sent.
	fence uint64
	ahead int64
	sent  time.Time
}

// Try runs the acquire script once, after following the wake-ups where
// they are published now. Granted (or handed the lock earlier, unheard),
// it returns the token; refused, it is queued, and the reply says how long
// to wait at most: the holder's remaining TTL, or the first waiter's
// liveness (negative if unknown).
func (t *turn) Try(ctx context.Context) (redislock.Reply, error) {
	if err := t.relisten(ctx); err != nil {
		return redislock.Reply{}, err
	}
	t.sent = time.Now()
	cfg := t.q.Config
	res, err := acquireArgs{n: t.n, owner: t.owner, member: t.member, ttl: cfg.TTL, life: queueLife(cfg), sharded: t.q.sharded}.
		run(ctx, t.q.Client, t.q.scripts.Acquire).Slice()
	if err != nil {
		return redislock.Reply{}, fmt.Errorf("%w: %w", locking.ErrUnavailable, err)
	}
	if len(res) < 2 {
		return redislock.Reply{}, fmt.Errorf("%w: acquire script returned %v", locking.ErrUnavailable, res)
	}
	granted, _ := res[0].(int64)
	count, _ := res[1].(int64)
	switch {
	case granted != 1:
		r := redislock.Reply{Wait: time.Duration(count) * time.Millisecond}
		if len(res) > 2 {
			r.Holder, _ = res[2].(string)
		}
		t.fence, t.ahead = 0, 0
		if len(res) > 4 {
			f, _ := res[3].(int64)
			t.ahead, _ = res[4].(int64)
			t.fence, t.ahead = uint64(max(f, 0)), max(t.ahead, 0)
		}
		return r, nil
	case count <= 0:
		return redislock.Reply{}, fmt.Errorf("%w: fence counter %s is %d, not positive", locking.ErrUnavailable, t.n.Fence, count)
	}
	if t.w != nil {
		t.w.Drain() // this grant used up the release we were told of
	}
	return redislock.Reply{Token: uint64(count), Sent: t.sent}, nil
}

// relisten follows the wake-ups when the last wait says they may be
// published elsewhere now: on a Cluster the slot may have moved to another
// master, or the Notifier ended with its node client. It runs before the
// try, so the try's refusal is heard where the release will be published.
func (t *turn) relisten(ctx context.Context) error {
	if !t.repick && !t.moved && !t.nt.Closed() {
		return nil
	}
	var next *waitq.Notifier
	var err error
	if t.moved {
		next, err = t.q.notifierAfterMove(ctx, t.n, t.movedTo)
	} else {
		next, err = t.q.notifierFor(ctx, t.n)
	}
	if err != nil {
		return err
	}
	// A watch that moved has ended: watch again, on the same node too
	// (after a sunsubscribe push, which names no node, it answers the new
	// SSUBSCRIBE with the one that serves the slot, unless it serves it
	// again). But when the node named by a MOVED is not a master in the
	// slot map, which still names this one, the fallback timer paces the
	// next attempt.
	again := false
	if t.w != nil {
		again, _ = t.w.Moved()
	}
	if next != t.nt || again && !(t.moved && t.movedTo != "") {
		if t.w != nil {
			t.w.Stop()
		}
		t.nt = next
		t.w = waitq.NewWaiter([]*waitq.Notifier{t.nt}, t.channel, t.member)
	}
	t.repick, t.moved = false, false
	return nil
}

// Wait waits, after a refusal, for a wake-up (a handoff, or a release to
// try after), the fallback timer, ctx or Close.
func (t *turn) Wait(ctx context.Context, attempt int, refused redislock.Reply) (redislock.Reply, error) {
	var woken <-chan struct{}
	switch {
	case t.w == nil:
		// Made after the try: a release since may be unheard, so the
		// next try comes once the subscription is confirmed.
		t.w = waitq.NewWaiter([]*waitq.Notifier{t.nt}, t.channel, t.member)
		woken = t.w.Subscribe()[0]
	case t.w.Listening() == 0:
		// Subscribe, and try again once the server confirms: a release
		// between the first try and the subscription is not lost.
		woken = t.w.Subscribe()[0]
	default:
		woken = t.w.Wake
	}
	// Each waiter ahead is a handoff before this one's turn: the fallback
	// (for a lost message) need not come sooner.
	cfg := t.q.Config
	d := waitq.Backoff(cfg.MinBackoff*time.Duration(1+min(t.ahead, 31)), cfg.MaxBackoff, attempt, refused.Wait)
	if t.timer == nil {
		t.timer = time.NewTimer(d)
	} else {
		t.timer.Reset(d)
	}
	select {
	case <-woken:
		if token, px, ok := t.q.handedOver(t.w, t.fence, t.sent); ok {
			t.w.Drain()
			return redislock.Reply{Token: token, Sent: t.sent, PX: px}, nil
		}
		t.moved, t.movedTo = t.w.Moved()
	case <-t.timer.C:
		t.repick = true
	case <-ctx.Done():
		return redislock.Reply{}, ctx.Err()
	case <-t.q.Closing:
		return redislock.Reply{}, redislock.ErrClosed
	}
	return redislock.Reply{}, nil
}

// Undo deletes the key if our owner holds it (a try's reply lost after the
// SET, or a lock handed to us) and leaves the queue, handing a free lock
// on. If it fails, the key expires, and so does our place (queueLife).
func (t *turn) Undo(ctx context.Context) { _, _ = t.q.release(ctx, t.n, t.owner, t.member) }

// End stops the waiter and the timer.
func (t *turn) End(bool) {
	if t.timer != nil {
		t.timer.Stop()
	}
	if t.w != nil {
		t.w.Stop()
	}
}
