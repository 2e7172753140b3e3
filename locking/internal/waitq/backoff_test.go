package waitq

import (
	"testing"
	"time"
)

// The fallback wait never exceeds hi, however lo is scaled (redislock
// scales it by the waiters ahead, up to 32 times) and whatever the limit:
// a waiter's place in the queue lives 2*(hi+lo) after its last try, and a
// wait past it loses the place (before, with lo = hi, as
// FallbackWait sets them, limit + rand(32 lo) reached 33 hi).
func TestBackoffAtMostHi(t *testing.T) {
	const hi = 100 * time.Millisecond
	for _, lo := range []time.Duration{time.Millisecond, hi, 32 * hi} {
		for attempt := range 8 {
			for _, limit := range []time.Duration{-1, 0, hi / 2, hi - time.Millisecond, hi, 10 * hi} {
				for range 200 {
					if d := Backoff(lo, hi, attempt, limit); d > hi || d < 0 {
						t.Fatalf("Backoff(lo %v, hi %v, attempt %d, limit %v) = %v, want within [0, %v]", lo, hi, attempt, limit, d, hi)
					}
				}
			}
		}
	}
}
