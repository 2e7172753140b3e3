package keepalive

import (
	"context"
	"sync"
	"testing"
	"time"
)

// hang is a renewal that never answers before its context ends, so that
// only the expiry alarm can close Lost.
func hang(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }

// A lease due before every alarm already set is not kept waiting for them:
// the one runtime timer is armed again for it. The test first makes an
// hour-long lease's alarm the one the timer waits for (a schedule that arms
// only for its first alarm, or only when none is pending, keeps the short
// lease's Lost open for that hour).
func TestAlarmEarlierThanArmed(t *testing.T) {
	long := Start(time.Hour, time.Now(), hang, nil)
	defer long.Stop()
	waitArmedNotBefore(t, long.next.at)

	const ttl = 150 * time.Millisecond
	k := Start(ttl, time.Now(), hang, nil)
	defer k.Stop()
	select {
	case <-k.lost: // the channel itself: Lost() would read the clock
	case <-time.After(10 * ttl):
		t.Fatal("Lost of a short lease still open after 10 TTLs: its alarm waited for a later one")
	}
}

// waitArmedNotBefore waits until the runtime timer is armed at at or
// later: alarms of leases stopped by earlier tests may be armed before it,
// until they ring.
func waitArmedNotBefore(t *testing.T, at time.Time) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		alarms.mu.Lock()
		armed := alarms.armed
		alarms.mu.Unlock()
		if !armed.Before(at) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timer armed at %v, before the long lease's renewal at %v", armed, at)
		}
	}
}

// Many leases due at different times, half of them stopped at once: each
// one left is lost in time (ring runs every alarm due and arms for the
// rest), none of those stopped renews, and stopped alarms leave the heap.
func TestAlarmsManyLeases(t *testing.T) {
	const n = 200
	var (
		mu      sync.Mutex
		renewed = make(map[int]bool)
	)
	ttl := func(i int) time.Duration { return 300*time.Millisecond + time.Duration(i)*time.Millisecond }
	ks := make([]*Watchdog, n)
	for i := range ks {
		ks[i] = Start(ttl(i), time.Now(), func(ctx context.Context) error {
			mu.Lock()
			renewed[i] = true
			mu.Unlock()
			return hang(ctx)
		}, nil)
		if i%2 == 0 {
			ks[i].Stop()
		}
	}
	deadline := time.After(10 * time.Second)
	for i := 1; i < n; i += 2 {
		select {
		case <-ks[i].lost:
		case <-deadline:
			t.Fatalf("lease %d of %d still not lost 10 s after its TTL of %v", i, n, ttl(i))
		}
	}
	for _, k := range ks {
		k.Stop()
	}
	alarms.mu.Lock()
	for i, k := range ks {
		if k.next.i >= 0 || k.expiry.i >= 0 {
			t.Errorf("lease %d stopped, its alarms still set (%d, %d)", i, k.next.i, k.expiry.i)
		}
	}
	alarms.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	for i := 0; i < n; i += 2 {
		if renewed[i] {
			t.Errorf("lease %d renewed, although stopped at its start", i)
		}
	}
}
