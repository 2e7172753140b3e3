// Package multi holds the locks of several keys together (a cart of
// SKUs), taken in sorted order so two carts never wait on each other.
package multi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/oversold-lab/oversold/locking"
)

// releaseTimeout bounds the release of the leases Acquire got before it
// failed: it runs on a context of its own, the caller's may be done.
const releaseTimeout = 5 * time.Second

// Leases are the leases of several keys, held together.
type Leases struct {
	leases []locking.Lease // in key order
	lost   chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once // closes lost
	ended  sync.Once // closes stop
}

// Acquire takes the locks of keys one after the other in one global
// order, sorted and without repeats, so two callers wanting {A, B} and
// {B, A} never wait for each other in a cycle: whoever holds the smaller
// key gets the larger one next. It blocks until every lock is held, ctx
// is done, or the backend fails; on failure it releases what it got, on a
// context of its own, and returns Acquire's error.
func Acquire(ctx context.Context, l locking.Locker, keys []string) (*Leases, error) {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	m := &Leases{lost: make(chan struct{}), stop: make(chan struct{})}
	for _, k := range keys {
		lease, err := l.Acquire(ctx, k)
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
			defer cancel()
			return nil, errors.Join(fmt.Errorf("acquire %q of %d keys: %w", k, len(keys), err), m.Release(rctx))
		}
		m.leases = append(m.leases, lease)
		m.wg.Add(1)
		go m.watch(lease)
	}
	return m, nil
}

// watch closes Lost when lease is lost, until Release.
func (m *Leases) watch(lease locking.Lease) {
	defer m.wg.Done()
	select {
	case <-lease.Lost():
		m.once.Do(func() { close(m.lost) })
	case <-m.stop:
	}
}

// Leases returns the leases held, in key order.
func (m *Leases) Leases() []locking.Lease { return m.leases }

// Lease returns the lease of key, or nil.
func (m *Leases) Lease(key string) locking.Lease {
	for _, l := range m.leases {
		if l.Key() == key {
			return l
		}
	}
	return nil
}

// Lost is closed once any of the leases can no longer be trusted. It looks
// at every lease itself too, so a check made right after a lease was lost
// does not depend on the watchers having run.
func (m *Leases) Lost() <-chan struct{} {
	for _, l := range m.leases {
		select {
		case <-l.Lost():
			m.once.Do(func() { close(m.lost) })
		default:
		}
	}
	return m.lost
}

// Release releases every lease, the last acquired first, even when some
// fail, and returns their errors joined (ErrNotHeld for a lost one). A
// second call releases again and gets ErrNotHeld for each.
func (m *Leases) Release(ctx context.Context) error {
	m.ended.Do(func() { close(m.stop) })
	m.wg.Wait()
	var errs []error
	for _, l := range slices.Backward(m.leases) {
		if err := l.Release(ctx); err != nil {
			errs = append(errs, fmt.Errorf("release %q: %w", l.Key(), err))
		}
	}
	return errors.Join(errs...)
}
