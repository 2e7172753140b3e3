// Package background runs the work a lock backend does for its callers
// after they have stopped waiting (zklock, etcdlock): the removal of a
// queue entry that a wait ended by ctx leaves behind, a request abandoned
// halfway, a Release that could not reach the server. The work must not
// use the caller's ctx, must go on until it is done or moot, and must end
// when the Locker closes; Close waits for it.
package background

import (
	"context"
	mrand "math/rand/v2"
	"sync"
	"time"
)

// Group is one Locker's background work. The zero value is not usable:
// call New.
type Group struct {
	ctx  context.Context // cancelled by Close
	stop context.CancelFunc
	// idle hands work to a goroutine that finished its own and waits for
	// more (unbuffered: a send succeeds only while one waits).
	idle chan func()

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// linger is how long a goroutine that finished its work waits for more
// before it ends. A backend runs a request per call on one (so that ctx can
// end the caller's wait); a new goroutine each time costs its start and the
// growth of its stack through the client's deep call path, which a reused
// one has already paid.
const linger = time.Second

// New returns an open Group.
func New() *Group {
	g := &Group{idle: make(chan func())}
	g.ctx, g.stop = context.WithCancel(context.Background())
	return g
}

// Go runs f on a goroutine that Wait waits for, one that finished its work
// within the last linger if any waits, else a new one; false, and f not
// run, after Close.
func (g *Group) Go(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	select {
	case g.idle <- f:
		return true
	default:
	}
	g.wg.Add(1)
	go g.work(f)
	return true
}

// work runs f, then the work Go hands it, until it has waited linger for
// more or the Group closes.
func (g *Group) work(f func()) {
	defer g.wg.Done()
	var t *time.Timer
	for {
		f()
		if t == nil {
			t = time.NewTimer(linger)
		} else {
			t.Reset(linger)
		}
		select {
		case f = <-g.idle:
		case <-t.C:
			return
		case <-g.ctx.Done():
			t.Stop()
			return
		}
	}
}

// Context is cancelled by Close: the context of the work that ends with
// the Locker.
func (g *Group) Context() context.Context { return g.ctx }

// Done is closed by Close.
func (g *Group) Done() <-chan struct{} { return g.ctx.Done() }

// Closed reports whether Close was called.
func (g *Group) Closed() bool { return g.ctx.Err() != nil }

// Close refuses new work and wakes the work that sleeps; Wait waits for it.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.stop()
}

// Wait waits for the work under way and, after Close, for the goroutines
// that waited for more.
func (g *Group) Wait() { g.wg.Wait() }

// Sleep waits d; false if ctx ended or the Group closed meanwhile.
func (g *Group) Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-g.ctx.Done():
		return false
	}
}

// Remove is the cleanup of something a caller left behind: it calls try,
// with Backoff between calls, until try reports the thing gone (or its
// removal moot: the session that owned it ended) or the Group closes. It
// never gives up otherwise: a queue entry left behind would hold its key
// for as long as its session lives.
func (g *Group) Remove(try func() (gone bool)) {
	for n := 0; !try(); n++ {
		if !g.Sleep(context.Background(), Backoff(n)) {
			return
		}
	}
}

// Backoff is the delay before retry n+1: jittered, exponential from 25 ms,
// at most 1 s.
func Backoff(n int) time.Duration {
	d := min(25*time.Millisecond<<min(n, 6), time.Second)
	return d/2 + mrand.N(d/2)
}
