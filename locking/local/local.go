// Package local is a lock that lives inside one process: a mutex per key.
//
// It is exclusive only among the goroutines of one process. Two replicas,
// each with its own local Locker, both hold "the" lock at once: this is the
// backend the lab uses to show oversell. Its tokens grow per process only,
// so they cannot fence writes from several replicas.
package local

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/oversold-lab/oversold/locking"
)

var _ locking.Locker = (*Locker)(nil)

// ErrClosed is returned by Acquire on a closed Locker.
var ErrClosed = errors.New("local: locker closed")

// Locker holds one entry per key while anyone holds or waits for it.
type Locker struct {
	mu     sync.Mutex
	keys   map[string]*entry
	tokens atomic.Uint64 // one counter for all keys: entries come and go
	closed atomic.Bool
}

type entry struct {
	sem  chan struct{} // a one-slot semaphore: waiting on it honours ctx
	refs int           // holders and waiters; the entry is freed at zero
}

// New returns an empty Locker.
func New() *Locker { return &Locker{keys: make(map[string]*entry)} }

// Acquire waits for the key's mutex or for ctx.
func (l *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if l.closed.Load() {
		return nil, fmt.Errorf("acquire %q: %w", key, ErrClosed)
	}
	l.mu.Lock()
	e := l.keys[key]
	if e == nil {
		e = &entry{sem: make(chan struct{}, 1)}
		l.keys[key] = e
	}
	e.refs++
	l.mu.Unlock()

	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		l.unref(key, e)
		return nil, fmt.Errorf("acquire %q: %w", key, ctx.Err())
	}
	return &lease{locker: l, key: key, entry: e, token: l.tokens.Add(1), lost: make(chan struct{})}, nil
}

// Close makes later Acquires fail. Leases still held stay held: there is
// nothing outside the process to let go of.
func (l *Locker) Close() error {
	l.closed.Store(true)
	return nil
}

func (l *Locker) unref(key string, e *entry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(l.keys, key)
	}
}

// held reports how many keys have an entry (for tests of cleanup).
func (l *Locker) held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

type lease struct {
	locker   *Locker
	key      string
	entry    *entry
	token    uint64
	lost     chan struct{} // never closed: an in-process mutex cannot be lost
	released atomic.Bool
}

func (s *lease) Key() string           { return s.key }
func (s *lease) Token() uint64         { return s.token }
func (s *lease) Lost() <-chan struct{} { return s.lost }

func (s *lease) Release(context.Context) error {
	if !s.released.CompareAndSwap(false, true) {
		return fmt.Errorf("release %q: %w", s.key, locking.ErrNotHeld)
	}
	<-s.entry.sem
	s.locker.unref(s.key, s.entry)
	return nil
}
