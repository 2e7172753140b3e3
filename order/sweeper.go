package order

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/storage"
)

// The sweeper gives back the stock of reservations past their expires_at.
// Expiry itself needs no sweep: MySQL's clock already refuses a confirm or
// a cancel past expires_at (settleOnce). Every replica runs one. With a
// distributed lock one sweeps at a time, holding the lock `sweeper`, and
// each expiry passes the lease's token, with the replica's fence epoch, to
// storage.SweeperFence in its transaction: a sweeper paused past its lease
// is refused once a newer one has written, and one of a backend the fleet
// has left at once. With lock none or local every replica sweeps; the
// conditional status change keeps each give-back single.

const (
	// DefaultSweepInterval is Config.SweepInterval's default, as
	// OVERSOLD_SWEEP_INTERVAL's.
	DefaultSweepInterval = time.Second
	// sweepBatch and sweepBatches bound one pass: at most sweepBatches
	// batches of sweepBatch reservations, oldest due first.
	sweepBatch   = 100
	sweepBatches = 10
	// sweepParallel is how many expiries of a pass run at once.
	sweepParallel = 4
	// sweepReadTimeout bounds each MySQL read of the sweeper. A read under
	// the SKUs' leases waits for a write in flight (InventoryLatest): one
	// whose writer is frozen between its UPDATE and its COMMIT would keep
	// the pass, the lock `sweeper` and the SKUs' leases until the writer
	// runs again or MySQL's lock wait gives up (50 s by default).
	sweepReadTimeout = 2 * time.Second
	// sweeperKey is the lock one sweeper at a time holds.
	sweeperKey = "sweeper"
)

// sweepLoop runs a pass every SweepInterval until Close, or until this
// replica withdraws.
func (s *Service) sweepLoop() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-s.withdrawn:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.BackCheck(ctx, time.Now()); err != nil && ctx.Err() == nil {
			s.log.Warn("gate back-check failed", "err", err)
		}
		if err := s.Reconcile(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("gate reconcile failed", "err", err)
		}
		if s.cfg.Gate != nil { // a key set due to be loaded again, or not trusted
			s.gateKeys(ctx, true)
		}
		if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("sweep failed", "err", err)
		}
	}
}

// Sweep runs one pass: it expires the held reservations that are due by
// MySQL's clock, oldest first, in bounded batches, and returns how many it
// expired. With a distributed lock it first waits (one SweepInterval at
// most) for the lock `sweeper`; not getting it means another replica
// sweeps, and this pass does nothing.
//
// A pass reads each batch on from the last hold of the batch before, so
// holds it could not expire do not hide younger ones; a pass that ends on
// its bound leaves the next one to go on from there, and the pass after
// that starts again from the oldest.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	defer s.observeSweep(ctx)
	var lease locking.Lease
	if s.locker != nil && s.cfg.Lock != "local" {
		wait, cancel := context.WithTimeout(ctx, s.cfg.SweepInterval)
		var err error
		lease, err = s.locker.Acquire(wait, sweeperKey)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return 0, nil // another replica sweeps
			}
			return 0, err
		}
		defer s.release(ctx, lease, s.hold(lease))
	}
	p := &sweepPass{lease: lease, failed: map[string]bool{}}
	if lease != nil {
		p.token = lease.Token()
	}
	s.sweepFrom.Lock()
	after := s.sweepFrom.after
	s.sweepFrom.Unlock()
	expired := 0
	for range sweepBatches {
		rctx, cancel := context.WithTimeout(ctx, sweepReadTimeout)
		due, err := s.sweeps.DueReservations(rctx, after, sweepBatch)
		cancel()
		if err != nil {
			return expired, err
		}
		n, err := s.expireAll(ctx, due, p)
		expired += n
		if err != nil {
			return expired, err
		}
		if len(due) < sweepBatch {
			after = storage.Reservation{} // the end: the next pass starts over
			break
		}
		after = due[len(due)-1]
	}
	s.sweepFrom.Lock()
	s.sweepFrom.after = after
	s.sweepFrom.Unlock()
	return expired, nil
}

// sweepPass is one pass's state: the lease `sweeper` and its token (nil
// and 0: none), and the SKUs whose expiry failed in this pass.
type sweepPass struct {
	lease  locking.Lease
	token  uint64
	mu     sync.Mutex
	failed map[string]bool
}

// fail notes skus as failing for the rest of the pass.
func (p *sweepPass) fail(skus []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, sku := range skus {
		p.failed[sku] = true
	}
}

// skips reports whether an expiry of skus failed in this pass: the next
// pass tries them again. Another expiry there would most likely wait for
// the same lease or row and fail the same way, keeping a slot of the pass
// (and the pass itself) from the holds it can expire.
func (p *sweepPass) skips(skus []string) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, sku := range skus {
		if p.failed[sku] {
			return true
		}
	}
	return false
}

// bound returns the context of one of the sweeper's MySQL reads: ctx
// itself for a request (its own deadline bounds it), sweepReadTimeout for
// the sweeper.
func (p *sweepPass) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if p == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, sweepReadTimeout)
}

// errSkipped: an expiry left to the next pass, its SKUs failing in this one.
var errSkipped = fmt.Errorf("a sku failed earlier in the pass: %w", storage.ErrSettled)

// expireAll expires due, sweepParallel at a time: each expiry waits for
// the locks of its SKUs behind the holds that queue there, so one at a time
// would let the lag grow under load. It stops at the first sign that a
// newer sweeper took over: its lease lost, or the sweeper fence refusing.
// Any other refusal or failure is one reservation's (a SKU's lease lost or
// not granted in time, its fence ahead of this backend's tokens, its row
// held by a writer that does not commit): the pass goes on without it, and
// without the other holds of its SKUs, else the oldest due hold, failing
// first on every pass, would stop every pass, or keep it waiting.
func (s *Service) expireAll(ctx context.Context, due []storage.Reservation, p *sweepPass) (int, error) {
	var (
		mu      sync.Mutex
		expired int
		stop    error
		wg      sync.WaitGroup
	)
	slots := make(chan struct{}, sweepParallel)
	for _, r := range due {
		mu.Lock()
		halted := stop != nil
		mu.Unlock()
		if halted || lost(p.lease) {
			break
		}
		slots <- struct{}{}
		if p.skips(r.Lines.SKUs()) {
			<-slots
			continue
		}
		wg.Go(func() {
			defer func() { <-slots }()
			done, err := s.settleOnce(ctx, r.ID, storage.StatusExpired, p)
			if err == nil && done.SettledBy != s.cfg.Instance {
				err = storage.ErrSettled // another replica's sweeper came first
			}
			s.metrics.reservations.WithLabelValues("expire", settleOutcome(storage.StatusExpired, err)).Inc()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				expired++
			case errors.Is(err, storage.ErrStaleSweeper):
				stop = err // a newer sweeper took over
			case errors.Is(err, storage.ErrSettled):
				// Another replica settled it first, or a SKU of it failed
				// earlier in the pass.
			default:
				// Failed or refused: the next pass finds it again if it is
				// still due.
				p.fail(r.Lines.SKUs())
				s.log.Debug("expiry failed", "reservation_id", r.ID, "err", err)
			}
		})
	}
	wg.Wait()
	if stop == nil && lost(p.lease) {
		stop = ErrLockLost
	}
	return expired, stop
}

// observeSweep sets the gauges from MySQL: stock reserved, sweep lag.
func (s *Service) observeSweep(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, sweepReadTimeout)
	defer cancel()
	st, err := s.sweeps.SweepState(ctx)
	if err != nil {
		return
	}
	s.metrics.stockReserved.Set(float64(st.Reserved))
	s.metrics.sweepLag.Set(st.Lag.Seconds())
}

// settleOutcome is the metrics outcome of a transition to status to.
func settleOutcome(to string, err error) string {
	if err == nil {
		return to
	}
	if errors.Is(err, storage.ErrSettled) {
		return "skipped"
	}
	_, _, _, outcome := classify(err)
	return outcome
}
