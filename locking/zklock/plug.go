package zklock

import (
	"context"
	"errors"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/oversold-lab/oversold/locking"
)

// CreateFunc makes our ephemeral sequential node under parent, named
// ...Suffix<sequence>, and returns its path and the session that owns it;
// ErrVanished makes Acquire queue again. A node made by a call that fails
// is deleted in the background. protected.Create also rides out a disconnect.
type CreateFunc func(l *Locker, parent string) (path string, session int64, err error)

// Watchdog keeps a granted lease's Lost between events: it runs check now
// and then, and closes Lost on locking.ErrNotHeld or once ttl has passed
// since the send time of the last check that succeeded (or of the grant).
type Watchdog interface {
	Lost() <-chan struct{}
	MarkLost()
	Stop() // no more checks, and no Lost from a check in flight
}

// WatchdogFunc starts the Watchdog of key's lease, granted by a request sent at sent.
type WatchdogFunc func(key string, ttl time.Duration, sent time.Time, check func(context.Context) error) Watchdog

// Backoff is the delay before retry n+1: jittered, from 25 ms up to 1 s.
func Backoff(n int) time.Duration {
	d := min(25*time.Millisecond<<min(n, 6), time.Second)
	return d/2 + mrand.N(d/2)
}

// watchdog is the default Watchdog: two timers per lease, one for the
// next check (every ttl/3, ttl/12 after a failure), one for the expiry.
type watchdog struct {
	ttl   time.Duration
	check func(context.Context) error
	lost  chan struct{}
	once  sync.Once

	mu      sync.Mutex
	until   time.Time
	stopped bool
	next    *time.Timer
	expiry  *time.Timer
}

func startWatchdog(_ string, ttl time.Duration, sent time.Time, check func(context.Context) error) Watchdog {
	w := &watchdog{ttl: ttl, check: check, lost: make(chan struct{}), until: sent.Add(ttl - drift(ttl))}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.expiry = time.AfterFunc(time.Until(w.until), func() { w.Lost() })
	w.next = time.AfterFunc(ttl/3, w.renew)
	return w
}

// drift is cut from every validity, for clocks that run at different rates.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// renew runs a check; once Lost is closed, nothing reopens it.
func (w *watchdog) renew() {
	select {
	case <-w.lost:
		return
	default:
	}
	sent := time.Now()
	err := w.check(context.Background())
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.stopped:
	case err == nil:
		w.until = sent.Add(w.ttl - drift(w.ttl))
		w.expiry.Reset(time.Until(w.until))
		w.next.Reset(w.ttl / 3)
	case errors.Is(err, locking.ErrNotHeld):
		w.MarkLost()
	default:
		w.next.Reset(w.ttl / 12)
	}
}

func (w *watchdog) Lost() <-chan struct{} {
	w.mu.Lock()
	expired := !w.stopped && !time.Now().Before(w.until)
	w.mu.Unlock()
	if expired {
		w.MarkLost()
	}
	return w.lost
}

func (w *watchdog) MarkLost() { w.once.Do(func() { close(w.lost) }) }

func (w *watchdog) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.next.Stop()
	w.expiry.Stop()
}
