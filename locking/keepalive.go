package locking

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Keepalive is the watchdog shared by the TTL-based backends (redis,
// redlock, mysql). It renews a lease every ttl/3 and closes Lost once the
// lease's validity runs out: validity is measured from the send time of the
// last successful renewal (a server expires the key at least that late),
// minus a drift margin for clocks running at different rates. A renewal
// answering ErrNotHeld ends the lease at once. Renewal never revives a lease:
// renew must check ownership on the server.
type Keepalive struct {
	lost   chan struct{}
	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	validUntil time.Time
}

// RenewFunc extends the lease on the server for another ttl. It returns
// ErrNotHeld when the server no longer knows this lease as its owner's.
type RenewFunc func(ctx context.Context) error

// Drift is the safety margin subtracted from a lease's validity: 1% of the
// TTL plus 2ms, as in the Redlock description.
func Drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// StartKeepalive starts renewing a lease granted by a request sent at sent.
// onFail, if not nil, hears every failed renewal (for metrics).
func StartKeepalive(ttl time.Duration, sent time.Time, renew RenewFunc, onFail func(error)) *Keepalive {
	ctx, cancel := context.WithCancel(context.Background())
	k := &Keepalive{
		lost:       make(chan struct{}),
		cancel:     cancel,
		done:       make(chan struct{}),
		validUntil: sent.Add(ttl - Drift(ttl)),
	}
	go k.run(ctx, ttl, renew, onFail)
	return k
}

// Lost is closed when the lease can no longer be trusted.
func (k *Keepalive) Lost() <-chan struct{} { return k.lost }

// Stop ends renewal and waits until no renewal is in flight, so that a
// release that follows cannot race a renewal.
func (k *Keepalive) Stop() {
	k.cancel()
	<-k.done
}

// MarkLost closes Lost; backends call it when they learn of the loss
// another way (a release that found the lease gone).
func (k *Keepalive) MarkLost() { k.once.Do(func() { close(k.lost) }) }

func (k *Keepalive) deadline() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.validUntil
}

func (k *Keepalive) run(ctx context.Context, ttl time.Duration, renew RenewFunc, onFail func(error)) {
	defer close(k.done)
	interval := ttl / 3
	next := time.NewTimer(interval)
	defer next.Stop()
	expiry := time.NewTimer(time.Until(k.deadline()))
	defer expiry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-expiry.C:
			k.MarkLost()
			return
		case <-next.C:
		}
		sent := time.Now()
		err, expired := k.renewWithin(ctx, renew, expiry.C)
		if expired {
			k.MarkLost()
			return
		}
		switch {
		case err == nil:
			valid := sent.Add(ttl - Drift(ttl))
			k.mu.Lock()
			k.validUntil = valid
			k.mu.Unlock()
			expiry.Reset(time.Until(valid))
			next.Reset(interval)
		case ctx.Err() != nil:
			return
		default:
			if onFail != nil {
				onFail(err)
			}
			if errors.Is(err, ErrNotHeld) {
				k.MarkLost()
				return
			}
			// Transient: try again soon; the expiry timer still bounds us.
			next.Reset(interval / 4)
		}
	}
}

// renewWithin runs one renewal but stops waiting for it when the lease's
// validity runs out: a client that does not honour its context (a stuck
// socket read) must not hold Lost open past the lease. It still waits for
// the renewal to return before reporting, so Stop keeps its promise.
func (k *Keepalive) renewWithin(ctx context.Context, renew RenewFunc, expiry <-chan time.Time) (err error, expired bool) {
	rctx, cancel := context.WithDeadline(ctx, k.deadline())
	defer cancel()
	result := make(chan error, 1)
	go func() { result <- renew(rctx) }()
	select {
	case err = <-result:
		return err, false
	case <-expiry:
		k.MarkLost()
		cancel()
		<-result
		return nil, true
	}
}
