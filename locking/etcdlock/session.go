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

// Renewal keeps one session lease alive. Lost closes once the lease can no
// longer be trusted and reads the clock (a holder back from a pause must
// find it closed); Stop ends renewing and waits for the renewal in flight.
type Renewal interface {
	Lost() <-chan struct{}
	MarkLost()
	Stop()
}

// RenewFunc extends the session lease once; locking.ErrNotHeld when the
// server no longer has it.
type RenewFunc func(ctx context.Context) error

// Namer numbers one session's queue keys: <queue><lease hex>-<n hex>. Give
// hands n back; only with reuse (its key known deleted, no request of ours
// on it in flight) may n come again, or a late delete would free a holder.
type Namer interface {
	Take(queue string) uint64
	Give(queue string, n uint64, reuse bool)
}

// counter is the default Namer: a new number every time.
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

// session returns the live session, granting a new one if the last was
// lost. Grants are one at a time, so that Close can wait for one under way.
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
	// The client retries an unreachable server until ctx ends: bound it.
	gctx, cancel := context.WithTimeout(ctx, max(l.cfg.TTL, 5*time.Second))
	defer cancel()
	defer context.AfterFunc(l.ctx, cancel)()
	sent := time.Now()
	resp, err := l.cli.Grant(gctx, max(int64((l.cfg.TTL+time.Second-1)/time.Second), 1))
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
	// Published even when Close came meanwhile: Close revokes it.
	l.mu.Lock()
	l.sess = s
	l.mu.Unlock()
	if !l.goBg(func() { l.watchSession(s) }) {
		return nil, errClosed
	}
	return s, nil
}

// watchSession ends s once lost (its leases' Lost close, its waiters queue
// again); the server may keep it, and its keys, until its TTL: OnLost.
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

// renewal is the default Renewal: KeepAliveOnce every TTL/3 (TTL/12 after a
// failure). The server expires the lease no sooner than the send time of
// the last renewal it answered plus the TTL: Lost closes there, less 1% for
// clock rates. (The client's KeepAlive stream tells of a loss later.)
type renewal struct {
	ttl   time.Duration
	renew RenewFunc
	lost  chan struct{}
	once  sync.Once
	stop  context.CancelFunc
	done  chan struct{}
	until atomic.Pointer[time.Time] // the lease's validity
}

// Renew is the default Config.Renew.
func Renew(ttl time.Duration, sent time.Time, renew RenewFunc) Renewal {
	r := &renewal{ttl: ttl, renew: renew, lost: make(chan struct{}), done: make(chan struct{})}
	r.extend(sent)
	ctx, stop := context.WithCancel(context.Background())
	r.stop = stop
	go r.loop(ctx)
	return r
}

func (r *renewal) extend(sent time.Time) { t := sent.Add(r.ttl - r.ttl/100); r.until.Store(&t) }

func (r *renewal) loop(ctx context.Context) {
	defer close(r.done)
	expiry, next := time.NewTimer(time.Until(*r.until.Load())), time.NewTimer(r.ttl/3)
	defer expiry.Stop()
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.lost: // marked lost from outside
			return
		case <-expiry.C:
			r.MarkLost()
			return
		case <-next.C:
		}
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, *r.until.Load())
		err := r.renew(rctx)
		cancel()
		switch {
		case isClosed(r.Lost()) || ctx.Err() != nil:
			return // a late answer must not revive a lease already lost
		case err == nil:
			r.extend(sent)
			expiry.Reset(time.Until(*r.until.Load()))
			next.Reset(r.ttl / 3)
		case errors.Is(err, locking.ErrNotHeld):
			r.MarkLost()
			return
		default:
			next.Reset(r.ttl / 12)
		}
	}
}

func (r *renewal) Lost() <-chan struct{} {
	if time.Now().After(*r.until.Load()) {
		r.MarkLost()
	}
	return r.lost
}

func (r *renewal) MarkLost() { r.once.Do(func() { close(r.lost) }) }
func (r *renewal) Stop()     { r.stop(); <-r.done }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
