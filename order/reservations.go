package order

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/multi"
	"github.com/oversold-lab/oversold/storage"
)

// Reservations (docs/design.md, "Reservations"): a hold moves each line's
// quantity from stock to reserved; confirm turns the lines into orders;
// cancel and expiry give the quantity back. Every transition runs the same
// way:
//
//  1. the locks of all its SKUs, in sorted order (multi.Acquire):
//     two carts with the same SKUs in opposite orders never deadlock
//  2. each line's row read from MySQL under its lock
//  3. a hold checks every line before writing anything: all or nothing
//  4. one transaction: the conditional status change (held -> another, by
//     MySQL's clock) and every line's stock write under the guard
//  5. the cache takes the rows written; the locks go, after the commit
//
// A version conflict runs the whole transition again, bounded, as orders do.

const (
	// DefaultReservationTTL is Config.ReservationTTL's default, as
	// OVERSOLD_RESERVATION_TTL's.
	DefaultReservationTTL = 10 * time.Minute
	// maxLines and maxTTLSeconds are the API's limits of a hold.
	maxLines      = 20
	maxTTLSeconds = 86400
)

// More errors of the API, for reservations.
var (
	// ErrReservationExpired: past its expires_at (MySQL's clock), swept or not.
	ErrReservationExpired = errors.New("reservation expired")
	// ErrReservationCancelled: a confirm of a cancelled reservation.
	ErrReservationCancelled = errors.New("reservation cancelled")
	// ErrReservationConfirmed: a cancel of a confirmed reservation.
	ErrReservationConfirmed = errors.New("reservation confirmed")
)

// Line is one SKU of a reservation.
type Line struct {
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
}

// Reservation is a reservation as the API shows it.
type Reservation struct {
	ID        string    `json:"id"`
	Status    string    `json:"status"`
	Lines     []Line    `json:"lines"`
	ExpiresAt time.Time `json:"expires_at"`
	OrderIDs  []string  `json:"order_ids"` // the orders a confirm made; [] before
	Instance  string    `json:"instance"`
	Lock      string    `json:"lock"`
	CreatedAt time.Time `json:"created_at"`
}

// HoldRequest is a hold to place. TTLSeconds 0 is Config.ReservationTTL;
// Key is the Idempotency-Key, "" for none.
type HoldRequest struct {
	Lines      []Line
	TTLSeconds int64
	Key        string
	id         string // the reservation's id, when chosen before the flow (the gate)
}

func (r HoldRequest) storageLines() []storage.Line {
	lines := make([]storage.Line, len(r.Lines))
	for i, l := range r.Lines {
		lines[i] = storage.Line{SKU: l.SKU, Quantity: l.Quantity}
	}
	return lines
}

// view is a stored reservation as the API shows it, with its orders. A
// hold past its expires_at by MySQL's clock shows expired, swept or not:
// that is what a confirm or a cancel of it answers. A read only reports;
// the stock goes back when a sweeper expires it (within a sweep interval
// or so), in a transaction under the SKUs' locks like every give-back.
func (s *Service) view(ctx context.Context, r storage.Reservation) (Reservation, error) {
	v := Reservation{
		ID: r.ID, Status: r.Status, ExpiresAt: r.ExpiresAt.UTC(), OrderIDs: []string{},
		Instance: r.Instance, Lock: r.Lock, CreatedAt: r.CreatedAt.UTC(),
	}
	if r.Status == storage.StatusHeld && r.Due {
		v.Status = storage.StatusExpired
	}
	for _, l := range r.Lines {
		v.Lines = append(v.Lines, Line{SKU: l.SKU, Quantity: l.Quantity})
	}
	if r.Status == storage.StatusConfirmed {
		ids, err := s.holds.ReservationOrders(ctx, r.ID)
		if err != nil {
			return Reservation{}, err
		}
		v.OrderIDs = ids
	}
	return v, nil
}

// GetReservation returns the reservation with id.
func (s *Service) GetReservation(ctx context.Context, id string) (Reservation, error) {
	r, err := s.holds.Reservation(ctx, id)
	if err != nil {
		return Reservation{}, err
	}
	return s.view(ctx, r)
}

// Hold holds every line of req, or none. replayed reports a reservation
// held earlier with the same key and the same request.
func (s *Service) Hold(ctx context.Context, req HoldRequest) (Reservation, bool, error) {
	if err := s.refuseIfWithdrawn(); err != nil {
		return Reservation{}, false, err
	}
	hold := s.holdFlow
	if s.cfg.Gate != nil {
		hold = s.holdGated // gate.go
	}
	r, replayed, err := hold(ctx, req)
	if errors.Is(err, storage.ErrOutOfStock) && req.Key != "" {
		// A retry that raced its own first try finds the stock that try
		// held: it is a replay, not a refusal.
		if prev, again, rerr := s.replayHold(ctx, req); again || rerr != nil {
			r, replayed, err = prev, again, rerr
		}
	}
	if err != nil {
		return Reservation{}, false, err
	}
	// The hold may be committed: what follows must not fail on the
	// request's time, or a 503 would say nothing was held.
	vctx, cancel := afterCommit(ctx)
	defer cancel()
	v, err := s.view(vctx, r)
	return v, replayed, err
}

// holdFlow is Hold past the gate.
func (s *Service) holdFlow(ctx context.Context, req HoldRequest) (storage.Reservation, bool, error) {
	return retried(ctx, func() (storage.Reservation, bool, error) { return s.holdOnce(ctx, req) })
}

func (s *Service) holdOnce(ctx context.Context, req HoldRequest) (storage.Reservation, bool, error) {
	if req.Key != "" {
		if r, replayed, err := s.replayHold(ctx, req); replayed || err != nil {
			return r, replayed, err
		}
	}
	skus := make([]string, len(req.Lines))
	for i, l := range req.Lines {
		skus[i] = l.SKU
	}
	for _, sku := range skus { // no lock state for SKUs that do not exist
		if err := s.exists(ctx, sku); err != nil {
			return storage.Reservation{}, false, err
		}
	}
	leases, holds, err := s.acquireAll(ctx, skus)
	if err != nil {
		return storage.Reservation{}, false, err
	}
	defer s.releaseAll(ctx, leases, holds)

	seen, err := s.readRows(ctx, skus, leases)
	if err != nil {
		return storage.Reservation{}, false, err
	}
	// All or nothing, decided before anything is written.
	var short []string
	for _, l := range req.Lines {
		if seen[l.SKU].Stock < l.Quantity {
			short = append(short, l.SKU)
		}
	}
	if len(short) > 0 {
		return storage.Reservation{}, false, &storage.OutOfStock{SKUs: short}
	}
	if err := s.beforeWrite(leases != nil && isClosed(leases.Lost()), "hold"); err != nil {
		return storage.Reservation{}, false, err
	}
	if err := s.invalidate(ctx, skus); err != nil {
		return storage.Reservation{}, false, err
	}

	lines := req.storageLines()
	moves := make([]storage.Move, len(lines))
	row := storage.Reservation{
		ID: req.id, Instance: s.cfg.Instance, Lock: s.cfg.Lock,
	}
	if row.ID == "" {
		row.ID = uuid.Must(uuid.NewV7()).String()
	}
	for i := range lines {
		lines[i].Token = token(leases, lines[i].SKU)
		row.Token = max(row.Token, lines[i].Token)
		moves[i] = storage.Move{Seen: seen[lines[i].SKU], Epoch: s.epoch.Load(), Token: lines[i].Token, Stock: -lines[i].Quantity, Reserved: lines[i].Quantity}
	}
	row.Lines = lines
	if req.Key != "" {
		row.IdempotencyKey = &req.Key
		row.Fingerprint = storage.ReservationFingerprint(lines, req.TTLSeconds)
	}
	ttl := s.cfg.ReservationTTL
	if req.TTLSeconds > 0 {
		ttl = time.Duration(req.TTLSeconds) * time.Second
	}

	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	held, after, err := s.holds.Hold(wctx, s.cfg.Guard, row, ttl, moves)
	cancel()
	s.reservationWritten(ctx, row.ID, "hold", lines[0].SKU, row.Token, err)
	// Whatever the write's outcome, what follows runs on a context of its
	// own: the write's may be what ran out.
	actx, cancel := afterCommit(ctx)
	defer cancel()
	if err != nil {
		return s.holdRefused(actx, req, row, leases, err)
	}
	s.cacheRows(actx, after, leases)
	s.reservationHook(ctx, HookHoldAfterCommit, held.ID, "hold", lines[0].SKU, held.Token, req.Key)
	return held, false, nil
}

// reservationHook tells the observers of a reservation's step at.
func (s *Service) reservationHook(ctx context.Context, at HookPoint, id, op, sku string, tok uint64, key string) {
	s.observe(ctx, Event{At: at, HookInfo: HookInfo{SKU: sku, Key: key, Token: tok, Reservation: id, Op: op}})
}

// replayHold answers a key already used: its reservation if the request
// is the same, ErrKeyReused if not, or if the key made an order (a key
// names one request, of either kind); replayed false when the key is new.
func (s *Service) replayHold(ctx context.Context, req HoldRequest) (storage.Reservation, bool, error) {
	prev, err := s.holds.ReservationByKey(ctx, req.Key)
	switch {
	case errors.Is(err, storage.ErrNoReservation):
		o, oerr := s.holds.OrderByKey(ctx, req.Key)
		switch {
		case oerr == nil:
			return storage.Reservation{}, false, fmt.Errorf("key names order %s: %w", o.ID, ErrKeyReused)
		case errors.Is(oerr, storage.ErrNotFound):
			return storage.Reservation{}, false, nil
		}
		return storage.Reservation{}, false, oerr
	case err != nil:
		return storage.Reservation{}, false, err
	case !bytes.Equal(prev.Fingerprint, storage.ReservationFingerprint(req.storageLines(), req.TTLSeconds)):
		return storage.Reservation{}, false, fmt.Errorf("key names reservation %s: %w", prev.ID, ErrKeyReused)
	}
	return prev, true, nil
}

// holdRefused handles a failed hold transaction: nothing was written, or
// (an error no guard explains) MySQL knows whether it was.
func (s *Service) holdRefused(ctx context.Context, req HoldRequest, row storage.Reservation, leases *multi.Leases, err error) (storage.Reservation, bool, error) {
	switch {
	case errors.Is(err, storage.ErrConflict):
		s.refreshLines(ctx, row.Lines, leases)
	case errors.Is(err, storage.ErrOutOfStock): // atomic guard: the read was behind
		s.refreshLines(ctx, row.Lines, leases)
	case errors.Is(err, storage.ErrStaleFence):
		err = fmt.Errorf("%w: %w", ErrLockLost, err)
	case errors.Is(err, storage.ErrDuplicate):
		// A concurrent request with the key, a hold or an order,
		// committed first.
		if r, replayed, rerr := s.replayHold(ctx, req); replayed || rerr != nil {
			return r, replayed, rerr
		}
	case errors.Is(err, storage.ErrUnknownSKU):
	default:
		// The outcome is unknown (a connection lost during COMMIT): the
		// reservation's id was chosen before the write.
		s.refreshLines(ctx, row.Lines, leases)
		if r, lerr := s.holds.Reservation(ctx, row.ID); lerr == nil {
			s.log.Warn("hold reported failed but committed", "reservation_id", row.ID, "err", err)
			return r, false, nil
		}
	}
	return storage.Reservation{}, false, err
}

// Confirm turns a held reservation into one order per line, in one
// transaction. Confirming a confirmed reservation returns it again.
func (s *Service) Confirm(ctx context.Context, id string) (Reservation, error) {
	return s.settleView(ctx, id, storage.StatusConfirmed)
}

// Cancel gives a held reservation's stock back. Cancelling a cancelled
// reservation returns it again.
func (s *Service) Cancel(ctx context.Context, id string) (Reservation, error) {
	return s.settleView(ctx, id, storage.StatusCancelled)
}

func (s *Service) settleView(ctx context.Context, id, to string) (Reservation, error) {
	if err := s.refuseIfWithdrawn(); err != nil {
		return Reservation{}, err
	}
	r, _, err := retried(ctx, func() (storage.Reservation, bool, error) {
		r, err := s.settleOnce(ctx, id, to, nil)
		return r, false, err
	})
	s.metrics.reservations.WithLabelValues(opOf[to], settleOutcome(to, err)).Inc()
	if err != nil {
		return Reservation{}, err
	}
	// r may have just been committed: reading its orders must not fail on
	// the request's time (a 503 says nothing was written).
	vctx, cancel := afterCommit(ctx)
	defer cancel()
	return s.view(vctx, r)
}

// opOf names the operation that moves a reservation to a status.
var opOf = map[string]string{
	storage.StatusConfirmed: "confirm", storage.StatusCancelled: "cancel", storage.StatusExpired: "expire",
}

// settleOnce moves reservation id from held to status to, once. A
// reservation already there is returned as it is; one elsewhere (or past
// its expires_at, by MySQL's clock) is the error of its status. p is the
// sweeper's pass for an expiry, nil for a confirm or a cancel.
func (s *Service) settleOnce(ctx context.Context, id, to string, p *sweepPass) (storage.Reservation, error) {
	var sweepToken uint64
	if p != nil {
		sweepToken = p.token
	}
	rctx, cancel := p.bound(ctx)
	r, err := s.holds.Reservation(rctx, id)
	cancel()
	if err != nil {
		return storage.Reservation{}, err
	}
	if r.Status != storage.StatusHeld || (r.Due && to != storage.StatusExpired) {
		return settled(r, to)
	}
	skus := r.Lines.SKUs()
	leases, holds, err := s.acquireAll(ctx, skus)
	if err != nil {
		return storage.Reservation{}, err
	}
	defer s.releaseAll(ctx, leases, holds)
	if p.skips(skus) { // failed in this pass while this expiry waited for them
		return storage.Reservation{}, errSkipped
	}
	rctx, cancel = p.bound(ctx)
	seen, err := s.readRows(rctx, skus, leases)
	cancel()
	if err != nil {
		return storage.Reservation{}, err
	}
	if err := s.beforeWrite(leases != nil && isClosed(leases.Lost()), opOf[to]); err != nil {
		return storage.Reservation{}, err
	}
	if err := s.invalidate(ctx, skus); err != nil {
		return storage.Reservation{}, err
	}

	hookToken := sweepToken
	for _, l := range r.Lines {
		hookToken = max(hookToken, token(leases, l.SKU))
	}
	s.reservationHook(ctx, HookSettleBeforeWrite, id, opOf[to], r.Lines[0].SKU, hookToken, "")

	epoch := s.epoch.Load()
	st, moves := s.settlement(id, r, to, seen, leases, epoch, sweepToken)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	done, after, err := s.holds.Settle(wctx, s.cfg.Guard, st, moves)
	cancel()
	s.reservationWritten(ctx, id, opOf[to], r.Lines[0].SKU, hookToken, err)
	// After the write, a context of its own: the write's may be what ran
	// out (a slow MySQL), and the request's may have ended meanwhile.
	actx, cancel := afterCommit(ctx)
	defer cancel()
	return s.settleOutcome(actx, id, r, to, leases, done, after, err)
}

// settlement is the write that moves reservation id (read as r) to status to: each line's stock
// and reserved counts, guarded by the row seen, and for a confirm its order.
func (s *Service) settlement(id string, r storage.Reservation, to string, seen map[string]storage.Inventory, leases *multi.Leases, epoch, sweepToken uint64) (storage.Settlement, []storage.Move) {
	st := storage.Settlement{ID: id, To: to, By: s.cfg.Instance, SweepEpoch: epoch, SweepToken: sweepToken}
	moves := make([]storage.Move, len(r.Lines))
	for i, l := range r.Lines {
		tok := token(leases, l.SKU)
		moves[i] = storage.Move{Seen: seen[l.SKU], Epoch: epoch, Token: tok, Stock: l.Quantity, Reserved: -l.Quantity}
		if to == storage.StatusConfirmed {
			moves[i].Stock = 0
			st.Orders = append(st.Orders, s.reservationOrder(id, l, tok))
		}
	}
	return st, moves
}

// settleOutcome answers the settlement of reservation id (read as r) to status to from the write's
// outcome (done, after, err), refreshing what the write may have left stale.
// actx is not the request's: the write is over, whatever ended meanwhile.
func (s *Service) settleOutcome(actx context.Context, id string, r storage.Reservation, to string, leases *multi.Leases, done storage.Reservation, after []storage.Inventory, err error) (storage.Reservation, error) {
	switch {
	case err == nil:
		s.cacheRows(actx, after, leases)
		if to != storage.StatusConfirmed {
			s.gateReturn(actx, done)
		}
		return done, nil
	case errors.Is(err, storage.ErrSettled):
		return settled(done, to)
	case errors.Is(err, storage.ErrConflict):
		s.refreshLines(actx, r.Lines, leases)
	case errors.Is(err, storage.ErrOutOfStock):
		s.refreshLines(actx, r.Lines, leases)
	case errors.Is(err, storage.ErrStaleFence), errors.Is(err, storage.ErrStaleSweeper):
		err = fmt.Errorf("%w: %w", ErrLockLost, err)
	default:
		// Unknown outcome: MySQL says whether the status changed.
		s.refreshLines(actx, r.Lines, leases)
		if now, lerr := s.holds.Reservation(actx, id); lerr == nil && now.Status == to {
			s.log.Warn("settle reported failed but committed", "reservation_id", id, "to", to, "err", err)
			if to != storage.StatusConfirmed {
				s.gateReturn(actx, now)
			}
			return now, nil
		}
	}
	return storage.Reservation{}, err
}

// settled answers a transition to status to of a reservation r that is not
// held (or, by MySQL's clock, is past its expires_at): r itself when it is
// already there, else the error of where it is.
func settled(r storage.Reservation, to string) (storage.Reservation, error) {
	switch r.Status {
	case to:
		return r, nil
	case storage.StatusConfirmed:
		return storage.Reservation{}, fmt.Errorf("reservation %s: %w", r.ID, ErrReservationConfirmed)
	case storage.StatusCancelled:
		return storage.Reservation{}, fmt.Errorf("reservation %s: %w", r.ID, ErrReservationCancelled)
	case storage.StatusHeld:
		if to == storage.StatusExpired { // not due yet by MySQL's clock
			return storage.Reservation{}, fmt.Errorf("reservation %s not due: %w", r.ID, storage.ErrSettled)
		}
	}
	return storage.Reservation{}, fmt.Errorf("reservation %s: %w", r.ID, ErrReservationExpired)
}

// reservationOrder is the order a confirm makes of one line.
func (s *Service) reservationOrder(id string, l storage.Line, tok uint64) storage.Order {
	return storage.Order{
		ID: uuid.Must(uuid.NewV7()).String(), SKU: l.SKU, Quantity: l.Quantity,
		Status: storage.StatusConfirmed, Instance: s.cfg.Instance, Lock: s.cfg.Lock, Token: tok,
		ReservationID: &id, CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
	}
}

// retried runs a transition again after a version conflict, up to
// maxAttempts times, with the same backoff as orders.
func retried(ctx context.Context, once func() (storage.Reservation, bool, error)) (storage.Reservation, bool, error) {
	for attempt := 1; ; attempt++ {
		r, replayed, err := once()
		if !errors.Is(err, storage.ErrConflict) || attempt == maxAttempts {
			return r, replayed, err
		}
		if err := clock.Sleep(ctx, rand.N(min(retryBase<<attempt, retryCap))); err != nil {
			return storage.Reservation{}, false, err
		}
	}
}

// acquireAll takes the locks of skus in sorted order, waiting at most
// LockWait in all, and starts watching each lease for the lease records;
// nil without a locker.
func (s *Service) acquireAll(ctx context.Context, skus []string) (*multi.Leases, []*holding, error) {
	if s.locker == nil {
		return nil, nil, nil
	}
	keys := make([]string, len(skus))
	for i, sku := range skus {
		keys[i] = "sku/" + sku
	}
	wait, cancel := context.WithTimeout(ctx, s.cfg.LockWait)
	defer cancel()
	start := time.Now()
	leases, err := multi.Acquire(wait, s.locker, keys)
	s.observe(ctx, Event{At: StepAcquired, HookInfo: HookInfo{SKU: skus[0]}, Wait: time.Since(start)})
	switch {
	case err == nil:
		holds := make([]*holding, len(leases.Leases()))
		for i, l := range leases.Leases() {
			holds[i] = s.hold(l)
		}
		return leases, holds, nil
	case ctx.Err() != nil:
		return nil, nil, err
	case errors.Is(err, context.DeadlineExceeded):
		return nil, nil, fmt.Errorf("%w after %v: %w", ErrLockTimeout, s.cfg.LockWait, err)
	default:
		return nil, nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
}

// releaseAll releases the leases after the commit, on a context of its
// own, and tells the observers (the lease records).
func (s *Service) releaseAll(ctx context.Context, leases *multi.Leases, holds []*holding) {
	if leases == nil {
		return
	}
	lost := make([]*time.Time, len(holds))
	for i, l := range leases.Leases() {
		lost[i] = holds[i].end(l)
	}
	released := time.Now()
	rctx, cancel := afterCommit(ctx)
	defer cancel()
	err := leases.Release(rctx)
	held := make([]Held, len(holds))
	for i, l := range leases.Leases() {
		held[i] = holds[i].record(l, lost[i], released)
	}
	s.observe(rctx, Event{At: StepReleased, Err: err, Held: held})
}

// reservationWritten tells the observers of a hold's or a settlement's
// write, settled with err.
func (s *Service) reservationWritten(ctx context.Context, id, op, sku string, tok uint64, err error) {
	s.observe(ctx, Event{At: StepReservationWritten, HookInfo: HookInfo{SKU: sku, Token: tok, Reservation: id, Op: op}, Err: err})
}

// token is the fencing token of sku's lease, 0 without one.
func token(leases *multi.Leases, sku string) uint64 {
	if leases == nil {
		return 0
	}
	if l := leases.Lease("sku/" + sku); l != nil {
		return l.Token()
	}
	return 0
}

// readRows reads the SKUs' rows from MySQL, the truth, under their locks.
func (s *Service) readRows(ctx context.Context, skus []string, leases *multi.Leases) (map[string]storage.Inventory, error) {
	read := s.holds.Inventory
	if leases != nil { // the latest commits, as a lease holder's order reads (loader)
		read = s.holds.InventoryLatest
	}
	rows := make(map[string]storage.Inventory, len(skus))
	for _, sku := range slices.Sorted(slices.Values(skus)) {
		inv, err := read(ctx, sku)
		if err != nil {
			return nil, err
		}
		rows[sku] = inv
	}
	return rows, nil
}

// invalidate deletes the SKUs' cache entries before a write under a guard
// that trusts the cache (as sell does): a replica killed between the
// commit and cacheRows leaves misses, not stock that orders would build on.
func (s *Service) invalidate(ctx context.Context, skus []string) error {
	if !s.trustsCache() {
		return nil
	}
	for _, sku := range skus {
		if err := s.cache.Invalidate(ctx, sku); err != nil {
			return fmt.Errorf("%w: guard %s needs the stock cache: %w", ErrUnavailable, s.cfg.Guard, err)
		}
	}
	return nil
}

// cacheRows puts the rows a transition wrote in the stock cache.
func (s *Service) cacheRows(ctx context.Context, rows []storage.Inventory, leases *multi.Leases) {
	for _, inv := range rows {
		s.cacheWrite(ctx, toItem(inv), lease(leases, inv.SKU))
	}
}

// refreshLines refreshes the cache entries of the lines' SKUs.
func (s *Service) refreshLines(ctx context.Context, lines storage.Lines, leases *multi.Leases) {
	for _, l := range lines {
		s.refresh(ctx, l.SKU, lease(leases, l.SKU))
	}
}

// lease is sku's lease, nil without one.
func lease(leases *multi.Leases, sku string) locking.Lease {
	if leases == nil {
		return nil
	}
	return leases.Lease("sku/" + sku)
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
