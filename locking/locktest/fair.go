package locktest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking"
)

// FairHandoff checks that a queued waiter keeps its place under steady
// arrivals on one key: contenders in separate Lockers (as in separate
// processes) each take the lock, hold it a moment, release it and at once
// ask again, so a new arrival is always racing the waiter the release
// woke. For every grant it counts the acquisitions that arrived later (took
// their ticket after it) and were granted first. A lock that lets a
// newcomer take the freed lock during the woken waiter's round trip
// demotes that waiter again and again, and the count grows without bound;
// a fair queue keeps it below the number of contenders (only arrivals
// racing to the server at the same moment can swap).
//
// Each Locker takes and releases a key of its own before the start, so no
// first Acquire spends its round trip dialling: a contender still
// connecting when the others cycle is late, not overtaken. A contender
// descheduled between its ticket and its send (the race detector, a busy
// machine) can still swap with the next round's arrivals, so the bound is
// two rounds; an unfair queue measured 86 (redis) and 15 (redlock).
//
// It asserts order, not time; the figures are logged with -v.
func FairHandoff[C any](t *testing.T, b Backend[C], contenders, grants int) {
	maxOvertakes := 2 * (contenders - 1)
	key := "fair-" + t.Name()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	lockers := make([]locking.Locker, contenders)
	for i := range lockers {
		lockers[i] = open(t, b)
		warm, err := lockers[i].Acquire(ctx, fmt.Sprintf("%s-warm-%d", key, i))
		if err != nil {
			t.Fatalf("contender %d: warming up: %v", i, err)
		}
		release(t, warm)
	}
	type acquisition struct{ ticket, grant int64 }
	var (
		tickets, granted atomic.Int64
		mu               sync.Mutex
		log              []acquisition
		wg               sync.WaitGroup
		start            = make(chan struct{})
	)
	for i, l := range lockers {
		wg.Go(func() {
			<-start
			for {
				ticket := tickets.Add(1) // arrival order, before the first try
				lease, err := l.Acquire(ctx, key)
				if err != nil {
					t.Errorf("contender %d: %v", i, err)
					return
				}
				grant := granted.Add(1) // under the lock: the exact grant order
				mu.Lock()
				log = append(log, acquisition{ticket, grant})
				mu.Unlock()
				time.Sleep(time.Millisecond)
				release(t, lease)
				if grant >= int64(grants) {
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	// Overtakes of each acquisition: later tickets granted before it.
	slices.SortFunc(log, func(a, b acquisition) int { return int(a.grant - b.grant) })
	worst, worstAt, total := 0, int64(0), 0
	for i, a := range log {
		n := 0
		for _, b := range log[:i] {
			if b.ticket > a.ticket {
				n++
			}
		}
		total += n
		if n > worst {
			worst, worstAt = n, a.grant
		}
	}
	t.Logf("%d grants among %d contenders: a waiter was overtaken by at most %d later arrivals (grant %d), %.2f on average",
		len(log), contenders, worst, worstAt, float64(total)/float64(len(log)))
	if worst > maxOvertakes {
		t.Errorf("a waiter was overtaken by %d later arrivals (grant %d), want at most %d: newcomers jump the queue", worst, worstAt, maxOvertakes)
	}
}
