package loadtest

import (
	"cmp"
	"slices"
	"time"
)

// Handoffs measures how long a lock stays free when it passes from one
// replica to another: for each key, the gap from a lease's end to the grant
// of the next lease, where the next holder is another replica. On a hot key
// some replica is always waiting, so the gap is the lock's own handoff
// cost (the release, the wake-up, the waiter's try), not idle time.
// Nil when no lease passed between replicas.
func Handoffs(leases []LeaseRecord) *Wait {
	byKey := map[string][]LeaseRecord{}
	for _, l := range leases {
		byKey[l.Key] = append(byKey[l.Key], l)
	}
	var gaps []time.Duration
	for _, ls := range byKey {
		slices.SortFunc(ls, func(a, b LeaseRecord) int { return a.AcquiredAt.Compare(b.AcquiredAt) })
		for i := 1; i < len(ls); i++ {
			prev, next := ls[i-1], ls[i]
			if gap := next.AcquiredAt.Sub(prev.End()); next.Instance != prev.Instance && gap >= 0 {
				gaps = append(gaps, gap)
			}
		}
	}
	if len(gaps) == 0 {
		return nil
	}
	slices.SortFunc(gaps, cmp.Compare)
	var sum time.Duration
	for _, g := range gaps {
		sum += g
	}
	ms := func(d time.Duration) float64 { return round(float64(d) / float64(time.Millisecond)) }
	return &Wait{
		Count: int64(len(gaps)),
		Mean:  ms(sum / time.Duration(len(gaps))),
		P50:   ms(gaps[len(gaps)/2]),
		P99:   ms(gaps[min(len(gaps)-1, len(gaps)*99/100)]),
	}
}
