package locktest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/oversold-lab/oversold/locking"
)

// BenchUncontended measures one Acquire and Release of a free key.
func BenchUncontended(b *testing.B, l locking.Locker) {
	ctx := context.Background()
	for b.Loop() {
		lease, err := l.Acquire(ctx, "uncontended")
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchHotKey runs one contender per entry of lockers on one key until b.N
// handoffs: ns/op is the time per handoff.
func BenchHotKey[L locking.Locker](b *testing.B, lockers []L) {
	ctx := context.Background()
	var (
		left atomic.Int64
		wg   sync.WaitGroup
	)
	left.Store(int64(b.N))
	b.ResetTimer()
	for _, l := range lockers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				lease, err := l.Acquire(ctx, "hot")
				if err != nil {
					b.Error(err)
					return
				}
				if err := lease.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
