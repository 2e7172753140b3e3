package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oversold-lab/oversold/locking"
)

// Renewal keeps one session lease alive. Lost is closed once the lease can
// no longer be trusted, and reads the clock: a holder back from a pause
// must find it closed before any timer has run. MarkLost closes it from
// outside; Stop ends the renewals and waits for the one in flight.
type Renewal interface {
	Lost() <-chan struct{}
	MarkLost()
	Stop()
}

// RenewFunc extends the session lease once; locking.ErrNotHeld when the
// server no longer has it.
type RenewFunc func(ctx context.Context) error

// Namer numbers one session's queue keys: <queue><lease hex>-<n hex>.
// Give hands a number back; reuse says its key is known deleted and no
// request of ours on it is in flight. A number may be handed out again only
// then: a delete still in flight would remove the next key of that name.
type Namer interface {
	Take(queue string) uint64
	Give(queue string, n uint64, reuse bool)
}

// counter is the default Namer: a new number every time, never reused.
type counter struct{ n atomic.Uint64 }

func (c *counter) Take(string) uint64        { return c.n.Add(1) }
func (c *counter) Give(string, uint64, bool) {}

// session is one etcd lease: every key of the Locker is bound to it.
type session struct {
	id     clientv3.LeaseID
	ttl    time.Duration // as granted
	r      Renewal
	names  Namer
	ctx    context.Context // ends when the session is lost or the Locker closes
	cancel context.CancelFunc
}

// session returns the live session, granting a new one if the last was lost.
// Grants are one at a time, so that Close can wait for one under way.
func (l *Locker) session(ctx context.Context) (*session, error) {
	l.granting.Lock()
	defer l.granting.Unlock()
	l.mu.Lock()
	closed, cur := l.closed, l.sess
	l.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	if cur != nil && cur.ctx.Err() == nil && !isClosed(cur.r.Lost()) {
		return cur, nil
	}
	// The client retries an unreachable server until ctx ends: bound it,
	// and end it with the Locker.
	gctx, cancel := context.WithTimeout(ctx, max(l.cfg.TTL, 5*time.Second))
	defer cancel()
	defer context.AfterFunc(l.ctx, cancel)()
	secs := max(int64((l.cfg.TTL+time.Second-1)/time.Second), 1)
	sent := time.Now()
	resp, err := l.cli.Grant(gctx, secs)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case l.ctx.Err() != nil:
		return nil, errClosed
	default:
		return nil, fmt.Errorf("%w: grant lease: %w", locking.ErrUnavailable, err)
	}
	s := &session{id: resp.ID, ttl: time.Duration(resp.TTL) * time.Second, names: l.cfg.Names()}
	s.ctx, s.cancel = context.WithCancel(l.ctx)
	s.r = l.cfg.Renew(s.ttl, sent, func(ctx context.Context) error {
		_, err := l.cli.KeepAliveOnce(ctx, s.id)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return locking.ErrNotHeld
		}
		return err
	})
	if l.afterGrant != nil {
		l.afterGrant()
	}
	// Published even when Close came meanwhile: Close waits for this grant
	// and revokes the session it finds.
	l.mu.Lock()
	l.sess = s
	l.mu.Unlock()
	if !l.goBg(func() { l.watchSession(s) }) {
		return nil, errClosed
	}
	return s, nil
}

// watchSession ends s once its renewal says it is lost, so that its leases'
// Lost close and its waiters queue again on a new session. The server may
// keep a lost lease, and its keys, until its TTL: OnLost hears of it.
func (l *Locker) watchSession(s *session) {
	select {
	case <-s.r.Lost():
	case <-s.ctx.Done():
	}
	s.cancel()
	if isClosed(s.r.Lost()) && l.cfg.OnLost != nil {
		l.cfg.OnLost(s.id, s.ttl)
	}
}

// revoke revokes s's lease, deleting its keys; nil also when the server no
// longer has it.
func (l *Locker) revoke(ctx context.Context, s *session) error {
	s.r.Stop()
	_, err := l.cli.Revoke(ctx, s.id)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return err
	}
	return nil
}

// renewal is the default Renewal: KeepAliveOnce every TTL/3, again at
// TTL/12 after a failure. The server expires the lease no sooner than the
// send time of the last renewal it answered plus the TTL, so Lost closes
// there, less 1% for clocks that run at different rates. (The client's
// KeepAlive stream tells a loss only once it has given up, after that.)
type renewal struct {
	ttl   time.Duration
	renew RenewFunc
	lost  chan struct{}
	once  sync.Once
	stop  context.CancelFunc
	done  chan struct{}

	mu    sync.Mutex
	until time.Time // the lease's validity
}

// Renew is the default Config.Renew.
func Renew(ttl time.Duration, sent time.Time, renew RenewFunc) Renewal {
	r := &renewal{ttl: ttl, renew: renew, lost: make(chan struct{}), done: make(chan struct{}), until: sent.Add(ttl - ttl/100)}
	ctx, stop := context.WithCancel(context.Background())
	r.stop = stop
	go r.loop(ctx)
	return r
}

func (r *renewal) loop(ctx context.Context) {
	defer close(r.done)
	expiry, next := time.NewTimer(time.Until(r.validUntil())), time.NewTimer(r.ttl/3)
	defer expiry.Stop()
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-expiry.C:
			r.MarkLost()
			return
		case <-next.C:
		}
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, r.validUntil())
		err := r.renew(rctx)
		cancel()
		switch {
		case isClosed(r.Lost()) || ctx.Err() != nil:
			return // a late answer must not revive a lease already lost
		case err == nil:
			r.mu.Lock()
			r.until = sent.Add(r.ttl - r.ttl/100)
			r.mu.Unlock()
			expiry.Reset(time.Until(r.validUntil()))
			next.Reset(r.ttl / 3)
		case errors.Is(err, locking.ErrNotHeld):
			r.MarkLost()
			return
		default:
			next.Reset(r.ttl / 12)
		}
	}
}

func (r *renewal) validUntil() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.until
}

func (r *renewal) Lost() <-chan struct{} {
	if time.Now().After(r.validUntil()) {
		r.MarkLost()
	}
	return r.lost
}

func (r *renewal) MarkLost() { r.once.Do(func() { close(r.lost) }) }

func (r *renewal) Stop() {
	r.stop()
	<-r.done
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
