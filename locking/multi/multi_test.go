package multi_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/locking/multi"
)

// TestAcquireAllOppositeOrders: callers wanting {a, b} and {b, a} at once,
// many times, all finish: the keys are taken in one order. Acquiring in
// the order given would deadlock here within a few rounds.
func TestAcquireAllOppositeOrders(t *testing.T) {
	l := local.New()
	defer l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		keys := []string{"a", "b", "c"}
		if w%2 == 1 {
			keys = []string{"c", "b", "a", "b"} // reversed, with a repeat
		}
		wg.Go(func() {
			<-start
			for range 200 {
				m, err := multi.Acquire(ctx, l, keys)
				if err != nil {
					t.Errorf("acquire %v: %v", keys, err)
					return
				}
				if n := len(m.Leases()); n != 3 {
					t.Errorf("%d leases, want 3 (repeats taken once)", n)
				}
				if err := m.Release(ctx); err != nil {
					t.Errorf("release: %v", err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
}

// TestAcquireAllCancelledWait: a wait that ends releases the locks already
// taken, so no key stays held by a caller that gave up.
func TestAcquireAllCancelledWait(t *testing.T) {
	l := local.New()
	defer l.Close()
	held, err := l.Acquire(t.Context(), "b")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := multi.Acquire(ctx, l, []string{"b", "a"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireAll while b is held: %v, want a deadline error", err)
	}
	// "a" was taken first (sorted) and must be free again.
	quick, cancel2 := context.WithTimeout(t.Context(), time.Second)
	defer cancel2()
	a, err := l.Acquire(quick, "a")
	if err != nil {
		t.Fatalf("a still held after the failed AcquireAll: %v", err)
	}
	a.Release(t.Context())
	held.Release(t.Context())
}

// TestAcquireAllLost: Lost closes when any one lease is lost, and Release
// still releases the others.
func TestAcquireAllLost(t *testing.T) {
	l := local.New()
	defer l.Close()
	lose := make(chan struct{})
	m, err := multi.Acquire(t.Context(), losing{l, "b", lose}, []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Lost():
		t.Fatal("Lost closed with every lease held")
	case <-time.After(20 * time.Millisecond):
	}
	close(lose)
	select {
	case <-m.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after b's lease was lost")
	}
	m.Release(t.Context())
	for _, k := range []string{"a", "b", "c"} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		lease, err := l.Acquire(ctx, k)
		cancel()
		if err != nil {
			t.Fatalf("%s not released: %v", k, err)
		}
		lease.Release(t.Context())
	}
}

// losing grants leases of key whose Lost is lose.
type losing struct {
	locking.Locker
	key  string
	lose chan struct{}
}

func (l losing) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	lease, err := l.Locker.Acquire(ctx, key)
	if err != nil || key != l.key {
		return lease, err
	}
	return lostLease{lease, l.lose}, nil
}

type lostLease struct {
	locking.Lease
	lost chan struct{}
}

func (l lostLease) Lost() <-chan struct{} { return l.lost }
