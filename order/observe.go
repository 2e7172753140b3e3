package order

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/oversold-lab/oversold/storage"
)

// Observer is told of each named step of the flows, once per step, with
// what the step knows. The replica's metrics and logs are observers
// (Metrics, logObserver); so is the lab's fault hook, which orderd adds
// only in its lab build. The flow waits for each call: at a fault point
// (HookPoint.Fault) the lab may hold the replica there.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc is a function that observes.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// Steps told to the observers besides the lab's fault points (the Hook*
// constants): they are not fault points.
const (
	// StepAcquired: step 2 ended, the lock granted or not (Wait).
	StepAcquired HookPoint = "acquired"
	// StepWritten: an order batch's step 6 settled (Orders, Err).
	StepWritten HookPoint = "written"
	// StepReservationWritten: a hold's or a settlement's write settled (Err).
	StepReservationWritten HookPoint = "reservation-written"
	// StepReleased: step 8 done, the leases released (Held, Err).
	StepReleased HookPoint = "released"
)

// Fault reports whether p is one of the lab's fault points, the Hook*
// constants, whose names and meaning the lab relies on.
func (p HookPoint) Fault() bool {
	switch p {
	case HookAfterRead, HookBeforeWrite, HookBeforeCommit, HookBeforeCache,
		HookAfterCommit, HookHoldAfterCommit, HookSettleBeforeWrite:
		return true
	}
	return false
}

// Event is what a step tells its observers.
type Event struct {
	At HookPoint
	HookInfo
	Orders int           // StepWritten: the orders of the write
	Err    error         // the step's failure, if any (written, released)
	Wait   time.Duration // StepAcquired: the time spent waiting
	Held   []Held        // StepReleased: each lease released
}

// Held is one lease's life, told at StepReleased.
type Held struct {
	Key      string
	Token    uint64
	Granted  time.Time
	LostAt   *time.Time // when the replica saw it lost; nil: it was not
	Released time.Time  // when the replica stopped relying on it
}

// observe tells every observer of e, in order: metrics, logs, then
// Config.Observers.
func (s *Service) observe(ctx context.Context, e Event) {
	for _, o := range s.observers {
		o.Observe(ctx, e)
	}
}

// guardRefused reports whether a write's err is its guard's refusal:
// another writer came first.
func guardRefused(err error) bool {
	return errors.Is(err, storage.ErrConflict) || errors.Is(err, storage.ErrStaleFence) || errors.Is(err, storage.ErrStaleSweeper)
}

// Observe keeps the series of the steps: lock wait and hold, leases
// lost, writes the guard refused.
func (m *Metrics) Observe(_ context.Context, e Event) {
	switch e.At {
	case StepAcquired:
		m.lockWait.Observe(e.Wait.Seconds())
	case StepWritten, StepReservationWritten:
		if guardRefused(e.Err) {
			m.guardConflicts.Inc()
		}
	case StepReleased:
		for _, h := range e.Held {
			if h.LostAt != nil {
				m.leasesLost.Inc()
			}
			m.lockHold.Observe(time.Since(h.Granted).Seconds())
		}
	}
}

// logObserver writes the log lines of the steps: the lab reads the write
// and lease records.
type logObserver struct{ log *slog.Logger }

func (l logObserver) Observe(_ context.Context, e Event) {
	switch e.At {
	case StepWritten:
		l.writeRecord(e)
	case StepReleased:
		if e.Err != nil {
			if len(e.Held) == 1 {
				l.log.Warn("lock release failed", "key", e.Held[0].Key, "err", e.Err)
			} else {
				l.log.Warn("lock release failed", "keys", len(e.Held), "err", e.Err)
			}
		}
		for _, h := range e.Held {
			l.leaseRecord(h)
		}
	}
}

// LeaseRecord is the message of the log line each replica writes per lease
// it held, at debug level: key, token, acquired_at, then released_at, or
// lost_at with lost true when the lease was lost while held. (orderd logs
// debug only in the lab's build, -tags labfaults.)
const LeaseRecord = "lease"

// leaseRecord logs the lease record: the lab pairs these across replicas
// to count two holders at once (same machine, same clock).
func (l logObserver) leaseRecord(h Held) {
	attrs := []any{"key", h.Key, "token", h.Token, "acquired_at", h.Granted, "lost", h.LostAt != nil}
	if h.LostAt != nil {
		attrs = append(attrs, "lost_at", *h.LostAt)
	} else {
		attrs = append(attrs, "released_at", h.Released)
	}
	l.log.Debug(LeaseRecord, attrs...) // every lease, the sweeper's each pass: debug
}

// WriteRecord is the message of the log line each replica writes per
// guarded write it settled: sku, token, orders, and outcome "committed", or
// "refused" when the guard found the stock or the fence moved on. The lab
// draws these on its lease timelines.
const WriteRecord = "write"

func (l logObserver) writeRecord(e Event) {
	outcome := "committed"
	switch {
	case e.Err == nil:
	case guardRefused(e.Err):
		outcome = "refused"
	default:
		return // not the guard's verdict: nothing to draw
	}
	l.log.Info(WriteRecord, "sku", e.SKU, "token", e.Token, "orders", e.Orders, "outcome", outcome)
}
