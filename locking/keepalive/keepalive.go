// Package keepalive renews a lease with a TTL and says when it can no
// longer be trusted: the watchdog of the redis, redlock and mysql locks.
package keepalive

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/oversold-lab/oversold/locking"
)

// Watchdog is the renewal loop shared by the TTL-based backends (redis,
// redlock, mysql; zookeeper and etcd keep their sessions' clocks with it).
// It renews a lease every ttl/3 and closes Lost once the lease's validity
// runs out: validity is measured from the send time of the last successful
// renewal (a server expires the key at least that late), minus a drift
// margin for clocks running at different rates. A renewal answering
// ErrNotHeld ends the lease at once. Renewal never revives a lease: renew
// must check ownership on the server.
//
// It runs on two alarms (alarm.go), which share one runtime timer with
// every other lease's, and no goroutine of its own: a lease that is
// released before its first renewal (most of them) costs two heap pushes
// and pops.
type Watchdog struct {
	ttl    time.Duration
	now    func() time.Time // time.Now; a test's clock can jump as a pause would
	renew  RenewFunc
	onFail func(error)
	lost   chan struct{}
	once   sync.Once
	flight sync.WaitGroup // the renewal in flight, if any

	mu         sync.Mutex
	stopped    bool
	cancel     context.CancelFunc // ends the renewal in flight when Stop is called
	validUntil time.Time
	period     time.Duration // the validity a renewal gives: the first grant's, then ttl
	next       alarm         // the next renewal
	expiry     alarm         // closes Lost at validUntil, whatever a renewal is doing
}

// RenewFunc extends the lease on the server for another ttl. It returns
// ErrNotHeld when the server no longer knows this lease as its owner's.
// ctx ends at the lease's validity and is cancelled as soon as the renewal
// returns: requests a renewal leaves to finish after it (redlock's slower
// nodes) run on context.WithoutCancel(ctx), bounded by ctx's deadline.
type RenewFunc func(ctx context.Context) error

// Drift is the safety margin subtracted from a lease's validity: 1% of the
// TTL plus 2ms, as in the Redlock description.
func Drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// Start starts renewing a lease granted by a request sent at sent.
// onFail, if not nil, hears every failed renewal (for metrics).
func Start(ttl time.Duration, sent time.Time, renew RenewFunc, onFail func(error)) *Watchdog {
	return start(time.Now, ttl, sent, renew, onFail)
}

// StartFirst is Start for a lease granted for first, less
// than ttl (redislock's direct handoff sets the key's PX short, so that a
// waiter that died does not block the key for a whole TTL): it is valid
// for first from sent and renewed first/3 from now (retried every
// first/12); each renewal then extends it to ttl.
func StartFirst(ttl, first time.Duration, sent time.Time, renew RenewFunc, onFail func(error)) *Watchdog {
	return startFirst(time.Now, ttl, min(first, ttl), sent, renew, onFail)
}

func start(now func() time.Time, ttl time.Duration, sent time.Time, renew RenewFunc, onFail func(error)) *Watchdog {
	return startFirst(now, ttl, ttl, sent, renew, onFail)
}

func startFirst(now func() time.Time, ttl, first time.Duration, sent time.Time, renew RenewFunc, onFail func(error)) *Watchdog {
	k := &Watchdog{
		ttl:        ttl,
		now:        now,
		renew:      renew,
		onFail:     onFail,
		lost:       make(chan struct{}),
		validUntil: sent.Add(first - Drift(first)),
		period:     first,
	}
	k.next = alarm{k: k, i: -1}
	k.expiry = alarm{k: k, expire: true, i: -1}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.expiry.set(k.validUntil.Sub(now()))
	k.next.set(first / 3)
	return k
}

// Lost is closed when the lease can no longer be trusted. It reads the
// clock itself rather than trust the expiry alarm alone: after a pause
// (SIGSTOP, a long GC) the holder's first look must find the lease gone,
// not race the alarm that was due to close it meanwhile.
func (k *Watchdog) Lost() <-chan struct{} {
	if !k.isLost() {
		k.mu.Lock()
		expired := !k.stopped && !k.now().Before(k.validUntil)
		k.mu.Unlock()
		if expired {
			k.MarkLost()
		}
	}
	return k.lost
}

// Stop ends renewal and waits until no renewal is in flight, so that a
// release that follows cannot race a renewal.
func (k *Watchdog) Stop() {
	k.mu.Lock()
	k.stopped = true
	k.next.stop()
	k.expiry.stop()
	cancel := k.cancel
	k.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	k.flight.Wait()
}

// MarkLost closes Lost; backends call it when they learn of the loss
// another way (a release that found the lease gone).
func (k *Watchdog) MarkLost() { k.once.Do(func() { close(k.lost) }) }

// expire closes Lost when the validity has ended. A renewal that answered
// after its expiry alarm was taken off the schedule, but before the
// alarm's goroutine ran, extended the validity and set the alarm again:
// closing Lost then would give up a lease just renewed.
func (k *Watchdog) expire() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.now().Before(k.validUntil) {
		k.MarkLost()
	}
}

func (k *Watchdog) isLost() bool {
	select {
	case <-k.lost:
		return true
	default:
		return false
	}
}

func (k *Watchdog) deadline() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.validUntil
}

// renewOnce runs on the next alarm. A renewal that cannot finish within the
// validity is worthless, so its context ends there; and one that hangs
// regardless (a client ignoring its context) does not hold Lost open, since
// the expiry alarm fires on its own.
func (k *Watchdog) renewOnce() {
	k.mu.Lock()
	if k.stopped || k.isLost() { // a renewal would extend a lease nobody trusts
		k.mu.Unlock()
		return
	}
	k.flight.Add(1)
	ctx, cancel := context.WithDeadline(context.Background(), k.validUntil)
	k.cancel = cancel
	k.mu.Unlock()
	defer k.flight.Done()

	sent := k.now()
	err := k.renew(ctx)
	cancel()

	k.mu.Lock()
	k.cancel = nil
	if k.stopped || k.isLost() {
		k.mu.Unlock()
		return // a late success must not revive a lease already lost
	}
	if err == nil {
		k.validUntil = sent.Add(k.ttl - Drift(k.ttl))
		k.period = k.ttl
		k.expiry.set(k.validUntil.Sub(k.now()))
		k.next.set(k.ttl / 3)
		k.mu.Unlock()
		return
	}
	if errors.Is(err, locking.ErrNotHeld) {
		k.MarkLost()
	} else {
		// Transient: try again soon; the expiry alarm still bounds us.
		k.next.set(k.period / 12)
	}
	k.mu.Unlock()
	// Outside k.mu: the expiry alarm takes it, and a callback that blocks
	// (a full log pipe) must not hold Lost open past the validity.
	if k.onFail != nil {
		k.onFail(err)
	}
}
