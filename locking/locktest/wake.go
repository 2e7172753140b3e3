package locktest

import (
	"context"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking"
)

// ReleaseWakesWaiter checks that a waiter is woken by the release message,
// not by its fallback timer. Open holder and waiter with the fallback timer
// and the TTL a minute away: then only the message wakes the waiter within
// the 10 s this allows. Three rounds on key "k", as the later rounds find
// the waiter's subscription lingering from the first.
func ReleaseWakesWaiter(t *testing.T, holder, waiter locking.Locker) {
	t.Helper()
	for round := range 3 {
		lease, err := holder.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := waiter.Acquire(t.Context(), "k")
			if err == nil {
				err = l.Release(context.Background())
			}
			got <- err
		}()
		time.Sleep(100 * time.Millisecond) // let it fail a try and subscribe
		released := time.Now()
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("round %d: woken %v after the release", round, time.Since(released).Round(time.Microsecond))
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the waiter was not woken by the release", round)
		}
	}
}
