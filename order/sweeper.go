package order

import (
	"context"
	"errors"
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
	var sweepToken uint64
	if lease != nil {
		sweepToken = lease.Token()
	}
	expired := 0
	for range sweepBatches {
		ids, err := s.store.DueReservations(ctx, sweepBatch)
		if err != nil {
			return expired, err
		}
		n, err := s.expireAll(ctx, ids, lease, sweepToken)
		expired += n
		if err != nil || len(ids) < sweepBatch {
			return expired, err
		}
	}
	return expired, nil
}

// expireAll expires ids, sweepParallel at a time: each expiry waits for
// the locks of its SKUs behind the holds that queue there, so one at a time
// would let the lag grow under load. It stops at the first sign that a
// newer sweeper took over: its lease lost, or the sweeper fence refusing.
// Any other refusal is one reservation's (a SKU's lease lost, or its fence
// ahead of this backend's tokens): the pass goes on without it, else the
// oldest due hold, refused first on every pass, would stop every pass.
func (s *Service) expireAll(ctx context.Context, ids []string, lease locking.Lease, sweepToken uint64) (int, error) {
	var (
		mu      sync.Mutex
		expired int
		stop    error
		wg      sync.WaitGroup
	)
	slots := make(chan struct{}, sweepParallel)
	for _, id := range ids {
		mu.Lock()
		halted := stop != nil
		mu.Unlock()
		if halted || lost(lease) {
			break
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			r, err := s.settleOnce(ctx, id, storage.StatusExpired, sweepToken)
			if err == nil && r.SettledBy != s.cfg.Instance {
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
			default:
				// Another replica settled it first, or it failed or was
				// refused: the next pass finds it again if it is still due.
				s.log.Debug("expiry skipped", "reservation_id", id, "err", err)
			}
		})
	}
	wg.Wait()
	if stop == nil && lost(lease) {
		stop = ErrLockLost
	}
	return expired, stop
}

// observeSweep sets the gauges from MySQL: stock reserved, sweep lag.
func (s *Service) observeSweep(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	st, err := s.store.SweepState(ctx)
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
