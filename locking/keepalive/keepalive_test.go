package keepalive

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking"
)

// The renew functions here are in-process stand-ins: the keepalive is pure
// timing logic; each backend's renewal is proven on its real server by locktest.

// A renewal may run up to 2/3 of the TTL late before the lease is lost: a
// 150 ms TTL (100 ms of slack) lost leases at load 30 on 2 cores.
func TestKeepaliveRenewsWhileRenewalsSucceed(t *testing.T) {
	const ttl = 600 * time.Millisecond
	var calls atomic.Int32
	k := Start(ttl, time.Now(), func(context.Context) error { calls.Add(1); return nil }, nil)
	defer k.Stop()
	select {
	case <-k.Lost():
		t.Fatal("Lost closed while every renewal succeeded")
	case <-time.After(3 * ttl):
	}
	if calls.Load() < 3 {
		t.Fatalf("%d renewals in 3 TTLs, want one every TTL/3", calls.Load())
	}
}

func TestKeepaliveLostWhenValidityRunsOut(t *testing.T) {
	const ttl = 150 * time.Millisecond
	var failures atomic.Int32
	sent := time.Now()
	k := Start(ttl, sent, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
		func(error) { failures.Add(1) })
	defer k.Stop()
	select {
	case <-k.Lost():
		// Lost is due before the server could expire the key: sent + ttl.
		if d := k.deadline(); !d.Before(sent.Add(ttl)) {
			t.Errorf("Lost was due %v after the grant was sent, not before the TTL %v", d.Sub(sent), ttl)
		}
	case <-time.After(5 * ttl):
		t.Fatal("Lost still open long after the lease's validity ran out")
	}
}

func TestKeepaliveLostAtOnceWhenNotHeld(t *testing.T) {
	const ttl = 3 * time.Second
	var failures atomic.Int32
	k := Start(ttl, time.Now(), func(context.Context) error { return locking.ErrNotHeld }, func(error) { failures.Add(1) })
	defer k.Stop()
	select {
	case <-k.Lost():
	case <-time.After(ttl / 2):
		t.Fatal("Lost still open after the server said the lease is not held")
	}
	// onFail runs after Lost closes (a blocking callback must not hold
	// Lost open): wait for it, boundedly.
	for wait := time.Now().Add(ttl); failures.Load() == 0 && time.Now().Before(wait); {
		time.Sleep(time.Millisecond)
	}
	if failures.Load() != 1 {
		t.Errorf("onFail heard %d failures, want 1", failures.Load())
	}
}

func TestKeepaliveTransientFailureRetriedSooner(t *testing.T) {
	const ttl = 300 * time.Millisecond
	var calls atomic.Int32
	k := Start(ttl, time.Now(), func(context.Context) error {
		if calls.Add(1) == 1 {
			return errors.New("connection reset")
		}
		return nil
	}, nil)
	defer k.Stop()
	select {
	case <-k.Lost():
		t.Fatal("one transient failure lost the lease")
	case <-time.After(3 * ttl):
	}
}

func TestKeepaliveStopIsSynchronous(t *testing.T) {
	var inFlight, after atomic.Int32
	var stopped atomic.Bool
	k := Start(30*time.Millisecond, time.Now(), func(ctx context.Context) error {
		if stopped.Load() {
			after.Add(1)
		}
		inFlight.Add(1)
		defer inFlight.Add(-1)
		time.Sleep(5 * time.Millisecond)
		return nil
	}, nil)
	time.Sleep(50 * time.Millisecond)
	k.Stop()
	stopped.Store(true)
	if inFlight.Load() != 0 {
		t.Fatal("a renewal was still in flight after Stop returned")
	}
	time.Sleep(60 * time.Millisecond)
	if after.Load() != 0 {
		t.Fatal("a renewal ran after Stop returned")
	}
}

// A renewal that ignores its context (a client stuck on a socket read) must
// not hold Lost open past the lease's validity.
func TestKeepaliveLostWhileRenewalHangs(t *testing.T) {
	const ttl = 150 * time.Millisecond
	unblock := make(chan struct{})
	k := Start(ttl, time.Now(), func(context.Context) error { <-unblock; return nil }, nil)
	select {
	case <-k.Lost():
	case <-time.After(5 * ttl):
		t.Error("Lost still open while a renewal hung past the lease's validity")
	}
	close(unblock)
	k.Stop()
}

// A failure callback that blocks (a metrics sink or logger stuck on a full
// pipe) must not hold Lost open past the lease's validity for a holder
// already waiting on it (before, onFail ran under the lock the
// expiry alarm takes).
func TestKeepaliveLostWhileOnFailBlocks(t *testing.T) {
	const ttl = 150 * time.Millisecond
	unblock := make(chan struct{})
	k := Start(ttl, time.Now(), func(context.Context) error { return errors.New("transient") },
		func(error) { <-unblock })
	lost := k.Lost() // taken while the lease is valid, as a holder's watcher does
	select {
	case <-lost:
	case <-time.After(5 * ttl):
		t.Error("Lost still open past the lease's validity while onFail blocked")
	}
	close(unblock)
	k.Stop()
}

// A holder resumed after a pause past its lease must find Lost closed at
// its first look, not once the expiry timer's goroutine gets to run. The
// test's clock jumps past the TTL as a pause would, with no timer firing:
// a Lost that trusts its timer, or checks the validity only at the start,
// stays open.
func TestLostReadsTheClock(t *testing.T) {
	const ttl = time.Minute
	var paused atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(paused.Load())) }
	k := start(now, ttl, now(), func(context.Context) error { return nil }, nil)
	defer k.Stop()
	select {
	case <-k.Lost():
		t.Fatal("Lost closed on a lease just granted")
	default:
	}
	paused.Store(int64(ttl))
	select {
	case <-k.Lost():
	default:
		t.Fatal("Lost open after a pause past the lease's validity")
	}
}

// A lease lost (here: a release found it gone) is renewed no more: a
// renewal would extend, on the server, a lease its holder no longer trusts.
func TestKeepaliveNoRenewalAfterLost(t *testing.T) {
	const ttl = 30 * time.Millisecond
	var calls atomic.Int32
	k := Start(ttl, time.Now(), func(context.Context) error { calls.Add(1); return nil }, nil)
	k.MarkLost()
	time.Sleep(2 * ttl) // past the first renewal's due time
	k.Stop()
	if n := calls.Load(); n != 0 {
		t.Errorf("%d renewals after the lease was lost", n)
	}
}

// A lease granted for first (a redis handoff's short PX) is trusted for
// first, not the TTL, until a renewal (due first/3 after the grant)
// extends it to the TTL: a renewal that hangs leaves it lost after about
// first; one that succeeds keeps it past first.
func TestKeepaliveFirst(t *testing.T) {
	const ttl, first = 10 * time.Second, 300 * time.Millisecond
	unblock := make(chan struct{})
	start := time.Now()
	k := StartFirst(ttl, first, start, func(context.Context) error { <-unblock; return nil }, nil)
	select {
	case <-k.Lost():
		if d := time.Since(start); d < first-Drift(first)-10*time.Millisecond {
			t.Errorf("Lost closed %v after the grant, before its validity (%v)", d, first)
		}
	case <-time.After(ttl / 2):
		t.Error("Lost still open past the first grant's validity: it trusted the TTL")
	}
	close(unblock)
	k.Stop()

	var calls atomic.Int32
	k = StartFirst(ttl, first, time.Now(), func(context.Context) error { calls.Add(1); return nil }, nil)
	defer k.Stop()
	time.Sleep(2 * first)
	select {
	case <-k.Lost():
		t.Fatal("Lost closed although the first renewal extended the lease to the TTL")
	default:
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d renewals in %v, want 1 (the first, due %v after the grant; then every %v)", n, 2*first, first/3, ttl/3)
	}
}

// A renewal that answers just as the validity ends, racing its expiry
// alarm, does not leave Lost closed on a lease it extended: 2000 leases
// whose first renewal answers success (as a reply read at its deadline)
// between 0.3 ms before and 0.1 ms after the validity's end, and whose next
// renewal hangs. Each Lost must close only once the
// validity is over. When the alarm closed Lost without looking, 509-847
// of the 2000 closed while a renewal had just extended the validity.
func TestExpiryAlarmHonoursARenewal(t *testing.T) {
	const n = 2000
	const ttl = 300 * time.Millisecond
	var early atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			var once atomic.Bool
			k := Start(ttl, time.Now(), func(ctx context.Context) error {
				if once.Swap(true) {
					return hang(ctx)
				}
				d, _ := ctx.Deadline()
				time.Sleep(time.Until(d) + time.Duration(rand.IntN(400)-300)*time.Microsecond)
				return nil // ignores ctx: the server answered
			}, nil)
			defer k.Stop()
			<-k.lost
			if time.Now().Before(k.deadline()) {
				early.Add(1)
			}
		})
	}
	wg.Wait()
	if early.Load() > 0 {
		t.Errorf("%d of %d leases lost while a renewal had extended their validity", early.Load(), n)
	}
}
