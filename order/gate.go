package order

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/storage"
)

// The stock gate (docs/design.md "The stock gate"): with Config.Gate set,
// an order or a hold first takes its quantity from the SKU's counter on
// Redis, in one Lua script; a gate that says no is 409 out_of_stock with
// no lock and no MySQL query. The flow then runs as configured, and its
// outcome settles the take: committed (done) or not (given back). The id
// of the order or reservation is chosen before the take and recorded with
// it, so MySQL can always tell whether the take committed:
//
//   - after the flow, an order that is not the take's own is looked up by
//     that id (a write of unknown outcome may have committed); a lookup that
//     fails leaves the take to the back-check;
//   - a replica that dies between its take and its settle leaves the take
//     pending: every replica's sweeper checks takes past their deadline
//     against MySQL by id (the back-check of dtm's two-phase messages) and
//     settles them. The deadline is gateBound after the take, longer than
//     any flow can run (RequestTimeout, then a write, then the lookups
//     after it), so a take is given back within gateBound plus one
//     SweepInterval of its replica's death, and never while its flow can
//     still commit. Should a commit land later anyway, its settle takes
//     the quantity again (inventory.Gate.Done).
//
// A take is tagged by its Idempotency-Key when it has one: a replay that
// arrives while the first is in flight takes nothing, and waits for the
// first to settle before it looks for the order again.
//
// A keyed request reads MySQL only when the gate says the key may name
// something: the take's script answers ErrKnown (it took for the key
// before) or ErrCheck (short, and its key set is not known to hold every
// key MySQL does); the request then looks the key up, as a replay, and
// takes again. A sold-out answer under a new key costs the script alone
// once the set is complete (gateKeys: loaded from MySQL at a seed, a reset,
// a check or a sweeper pass). The set is lost only with the counters (or
// emptied by a PUT), and loaded again; a take in flight across that adds
// its key when it settles, or the second load a keysBound later does
// (docs/design.md "The stock gate" says what window remains).

// StockGate is the stock gate (inventory.Gate); nil in Config: no gate.
type StockGate interface {
	Take(ctx context.Context, tag, entry string, deadline time.Time, key inventory.TakeKey, lines []inventory.Line) error
	Done(ctx context.Context, tag string, lines []inventory.Line) (bool, error)
	GiveBack(ctx context.Context, tag string, lines []inventory.Line) (bool, error)
	Settle(ctx context.Context, p inventory.Pending, committed bool, lines []inventory.Line) (bool, error)
	Seed(ctx context.Context, sku string, stock int64) error
	Reset(ctx context.Context, sku string, stock int64) error
	Reconcile(ctx context.Context, sku string, stock int64, seq uint64) (bool, error)
	Counter(ctx context.Context, sku string) (inventory.Counter, bool, error)
	Due(ctx context.Context, now time.Time, limit int) ([]inventory.Pending, error)
	SKUs(ctx context.Context, n int) ([]string, error)
	CompleteKeys(ctx context.Context, bound time.Duration, load func(context.Context) ([]string, bool, error)) (bool, error)
	ResetKeys(ctx context.Context) error
	ForgetKeys(ctx context.Context) error
}

const (
	// gateTimeout bounds one call to the gate's Redis.
	gateTimeout = time.Second
	// inFlightPoll is how often a replay whose first is in flight looks
	// again.
	inFlightPoll = 20 * time.Millisecond
	// backCheckBatch bounds the takes one back-check pass settles, and
	// reconcileBatch the counters one pass reconciles.
	backCheckBatch = 100
	reconcileBatch = 20
	// maxGateKeys bounds the keys loaded into the gate's key set: with
	// more in MySQL, the set stays incomplete and a short keyed request
	// reads MySQL. keysRetry is how long after a failed load the next
	// one is tried.
	maxGateKeys = 10000
	keysRetry   = time.Minute
)

// gateBound is how long after its take a pending take is left to its
// flow: longer than the flow can run.
func (s *Service) gateBound() time.Duration {
	return s.cfg.RequestTimeout + 2*writeTimeout + afterCommitTimeout
}

// keysBound is how long after the gate's key set was found incomplete
// (lost with its Redis's data, reset, completed on another Redis process)
// it is loaded again from MySQL: a take made before, whose key the set
// lost, has committed by then or never will (inventory.Gate.CompleteKeys).
// With the queue, a consumer holds a delivered order for one claim's idle
// time.
func (s *Service) keysBound() time.Duration {
	if s.cfg.Queue != nil {
		return max(s.gateBound(), s.claimIdle())
	}
	return s.gateBound()
}

// gateEntry is what a take records beside its tag: enough for a
// back-check on any replica.
type gateEntry struct {
	Kind     string           `json:"kind"` // order or hold
	ID       string           `json:"id"`
	Lines    []inventory.Line `json:"lines"`
	Deadline int64            `json:"deadline"` // unix ms
}

// gateTag names a take: by its key when it has one (one take per key in
// flight), else by its id. A tag "<kind>:key:<key>" tells the gate's settle
// the take's key (inventory.Gate.Done adds it to the key set).
func gateTag(kind, key, id string) string {
	if key != "" {
		return kind + ":key:" + key
	}
	return kind + ":id:" + id
}

// gateTake takes lines for the order or hold id. It returns nil once taken;
// storage.ErrOutOfStock when the gate is short; inventory.ErrInFlight when
// the tag's take is pending; inventory.ErrKnown or ErrCheck when the key
// is to be looked up in MySQL first (a check also loads the gate's key
// set, unless it is loading).
func (s *Service) gateTake(ctx context.Context, kind, tag, id string, key inventory.TakeKey, lines []inventory.Line) error {
	deadline := time.Now().Add(s.gateBound())
	entry, err := json.Marshal(gateEntry{Kind: kind, ID: id, Lines: lines, Deadline: deadline.UnixMilli()})
	if err != nil {
		return err
	}
	for seeded := false; ; seeded = true {
		gctx, cancel := context.WithTimeout(ctx, gateTimeout)
		err = s.cfg.Gate.Take(gctx, tag, string(entry), deadline, key, lines)
		cancel()
		switch {
		case err == nil:
			s.metrics.gate.WithLabelValues("taken").Inc()
			return nil
		case errors.Is(err, inventory.ErrShort):
			s.metrics.gate.WithLabelValues("short").Inc()
			return fmt.Errorf("%w (gate): %w", storage.ErrOutOfStock, err)
		case errors.Is(err, inventory.ErrCheck):
			s.gateKeys(ctx, true)
			return err
		case errors.Is(err, inventory.ErrInFlight), errors.Is(err, inventory.ErrKnown):
			return err
		case errors.Is(err, inventory.ErrKeyQueued):
			return fmt.Errorf("key names a queued order: %w", ErrKeyReused)
		case errors.Is(err, inventory.ErrUnseeded) && !seeded:
			if err := s.gateSeed(ctx, lines); err != nil {
				return err
			}
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			return fmt.Errorf("%w: stock gate: %w", ErrUnavailable, err)
		}
	}
}

// gateSeed seeds the counters of lines that have none from MySQL. Two
// replicas seeding at once set each counter once (inventory.Gate.Seed).
func (s *Service) gateSeed(ctx context.Context, lines []inventory.Line) error {
	for _, l := range lines {
		item, err := s.shared(ctx, l.SKU) // storage.ErrUnknownSKU: 404, no key
		if err != nil {
			return err
		}
		s.skus.add(l.SKU)
		gctx, cancel := context.WithTimeout(ctx, gateTimeout)
		err = s.cfg.Gate.Seed(gctx, l.SKU, item.Stock)
		cancel()
		if err != nil {
			return fmt.Errorf("%w: stock gate: %w", ErrUnavailable, err)
		}
	}
	s.gateKeys(ctx, false)
	return nil
}

// gateKeys completes the gate's key set from MySQL, if it is not complete
// (a new or reseeded gate) or due to be loaded again (keysBound after it
// was found incomplete), and no other request of this replica is loading
// it. After a failed load (too many keys, or an error), a check tries
// again only keysRetry later; a load another took over is no failure. A failure is not the request's: its keys
// are then looked up in MySQL. The sweeper checks every pass, and marks
// the set incomplete while a live replica does not record its keys.
func (s *Service) gateKeys(ctx context.Context, check bool) {
	if !s.keysLoad.TryLock() {
		return
	}
	defer s.keysLoad.Unlock()
	if check && time.Since(s.keysLoad.failed) < keysRetry {
		return
	}
	gctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	if others, err := s.keysUnrecorded(gctx); err != nil || others != "" {
		if err == nil {
			s.log.Warn("gate key set incomplete while a live replica does not record its keys", "replica", others)
			err = s.cfg.Gate.ForgetKeys(gctx)
		}
		if err != nil {
			s.log.Warn("gate key set: peers unknown", "err", err)
		}
		return
	}
	complete, err := s.cfg.Gate.CompleteKeys(gctx, s.keysBound(), func(ctx context.Context) ([]string, bool, error) {
		return s.store.IdempotencyKeys(ctx, maxGateKeys)
	})
	switch {
	case err != nil: // an error, or too many keys
		s.keysLoad.failed = time.Now()
		s.log.Warn("gate key set incomplete: short keyed requests read MySQL", "err", err)
	case !complete: // another load, a reset or a forget took over: load again next time
		s.log.Debug("gate key set load superseded")
	}
}

// keysUnrecorded names a live replica of the database that does not
// record the keys it takes for in the gate's key set ("" for none): one of
// an older version, or ungated, which Start refuses beside this one but
// which may have started while this replica's row had lapsed (frozen past
// liveWithin). While it lives the set is not complete.
func (s *Service) keysUnrecorded(ctx context.Context) (string, error) {
	peers, err := s.readiness.LiveReplicas(ctx, liveWithin)
	if err != nil {
		return "", err
	}
	for _, p := range peers {
		if p.Instance != s.cfg.Instance && gateOf(p) != s.gateName() {
			return p.Instance, nil
		}
	}
	return "", nil
}

// gateSettle settles a take once its flow is over: committed says whether
// it committed; unknown whether the flow could not tell, and lookup
// (MySQL, by the take's id) decides. A lookup that fails leaves the take
// to the back-check. It runs on a context of its own: the client's may be
// what ended the flow.
func (s *Service) gateSettle(ctx context.Context, tag string, lines []inventory.Line, committed bool, lookup func(context.Context) (bool, error)) {
	ctx, cancel := afterCommit(ctx)
	defer cancel()
	if !committed {
		var err error
		if committed, err = lookup(ctx); err != nil {
			s.log.Warn("gate take left to the back-check", "tag", tag, "err", err)
			return
		}
	}
	settle, outcome := s.cfg.Gate.GiveBack, "given_back"
	if committed {
		settle, outcome = s.cfg.Gate.Done, "done"
	}
	if _, err := settle(ctx, tag, lines); err != nil {
		s.log.Warn("gate settle failed: left to the back-check", "tag", tag, "err", err)
		return
	}
	s.metrics.gate.WithLabelValues(outcome).Inc()
}

// placeGated is Place behind the gate.
func (s *Service) placeGated(ctx context.Context, req Request) (Order, bool, error) {
	lines := []inventory.Line{{SKU: req.SKU, Quantity: req.Quantity}}
	key := inventory.TakeKey{Key: req.Key}
	for {
		// A replay takes nothing: a key the gate may know is looked up.
		if key.Checked {
			if o, replayed, err := s.replayOrder(ctx, req); !errors.Is(err, storage.ErrNotFound) {
				return o, replayed, err // the order, or the key names a hold (422)
			}
		}
		req.id = uuid.Must(uuid.NewV7()).String()
		tag := gateTag("order", req.Key, req.id)
		err := s.gateTake(ctx, "order", tag, req.id, key, lines)
		if key.Checked && errors.Is(err, storage.ErrOutOfStock) {
			// The key's first try may have committed, and settled its
			// take, since the lookup: its replay is not short.
			if o, replayed, perr := s.replayOrder(ctx, req); perr == nil || errors.Is(perr, ErrKeyReused) {
				return o, replayed, perr
			}
		}
		if again, err := s.takeAgain(ctx, err, &key); again || err != nil {
			if err != nil {
				return Order{}, false, err
			}
			continue
		}
		o, replayed, err := s.place(ctx, req)
		id := req.id
		s.gateSettle(ctx, tag, lines, err == nil && o.ID == id, func(ctx context.Context) (bool, error) {
			return s.orderExists(ctx, id)
		})
		return o, replayed, err
	}
}

// takeAgain answers a take's error: again when the key is to be looked up
// first (known, or a short the gate cannot tell from a replay) or its
// first take is in flight (after a pause); else the error, nil when taken.
func (s *Service) takeAgain(ctx context.Context, err error, key *inventory.TakeKey) (bool, error) {
	switch {
	case errors.Is(err, inventory.ErrKnown), errors.Is(err, inventory.ErrCheck):
		key.Checked = true
		return true, nil
	case errors.Is(err, inventory.ErrInFlight): // the key's first try
		key.Checked = true
		return true, clock.Sleep(ctx, inFlightPoll)
	}
	return false, err
}

// orderExists reports whether the order id is in MySQL.
func (s *Service) orderExists(ctx context.Context, id string) (bool, error) {
	_, err := s.store.Order(ctx, id)
	if errors.Is(err, storage.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// reservationExists reports whether the reservation id is in MySQL.
func (s *Service) reservationExists(ctx context.Context, id string) (bool, error) {
	_, err := s.holds.Reservation(ctx, id)
	if errors.Is(err, storage.ErrNoReservation) || errors.Is(err, storage.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// holdGated is Hold behind the gate: a hold takes as orders do.
func (s *Service) holdGated(ctx context.Context, req HoldRequest) (storage.Reservation, bool, error) {
	lines := make([]inventory.Line, len(req.Lines))
	for i, l := range req.Lines {
		lines[i] = inventory.Line{SKU: l.SKU, Quantity: l.Quantity}
	}
	key := inventory.TakeKey{Key: req.Key, Hold: true}
	for {
		if key.Checked {
			if r, replayed, err := s.replayHold(ctx, req); replayed || err != nil {
				return r, replayed, err
			}
		}
		req.id = uuid.Must(uuid.NewV7()).String()
		tag := gateTag("hold", req.Key, req.id)
		err := s.gateTake(ctx, "hold", tag, req.id, key, lines)
		if key.Checked && errors.Is(err, storage.ErrOutOfStock) { // as placeGated
			if r, replayed, rerr := s.replayHold(ctx, req); replayed || rerr != nil {
				return r, replayed, rerr
			}
		}
		if again, err := s.takeAgain(ctx, err, &key); again || err != nil {
			if err != nil {
				return storage.Reservation{}, false, err
			}
			continue
		}
		r, replayed, err := s.holdFlow(ctx, req)
		id := req.id
		s.gateSettle(ctx, tag, lines, err == nil && r.ID == id, func(ctx context.Context) (bool, error) {
			return s.reservationExists(ctx, id)
		})
		return r, replayed, err
	}
}

// gateReturn gives a committed hold's lines back to the gate: it was
// cancelled or expired. A failure leaves the counter short (undersold)
// until the reconciler.
func (s *Service) gateReturn(ctx context.Context, r storage.Reservation) {
	if s.cfg.Gate == nil {
		return
	}
	ctx, cancel := afterCommit(ctx)
	defer cancel()
	lines := make([]inventory.Line, len(r.Lines))
	for i, l := range r.Lines {
		lines[i] = inventory.Line{SKU: l.SKU, Quantity: l.Quantity}
	}
	if _, err := s.cfg.Gate.GiveBack(ctx, "", lines); err != nil {
		s.log.Warn("gate give-back of a settled hold failed", "reservation_id", r.ID, "err", err)
	}
}

// BackCheck settles the takes pending past their deadline at now against
// MySQL: those whose order or hold committed are done, the rest are given
// back. Every replica runs it in its sweep loop; the settles are
// idempotent. It returns how many takes it gave back.
func (s *Service) BackCheck(ctx context.Context, now time.Time) (int, error) {
	if s.cfg.Gate == nil {
		return 0, nil
	}
	due, err := s.cfg.Gate.Due(ctx, now, backCheckBatch)
	if err != nil {
		return 0, err
	}
	given := 0
	for _, p := range due {
		var e gateEntry
		if err := json.Unmarshal([]byte(p.Entry), &e); err != nil {
			s.log.Warn("gate entry unreadable", "tag", p.Tag, "err", err)
			continue
		}
		exists := s.orderExists
		if e.Kind == "hold" {
			exists = s.reservationExists
		}
		committed, err := exists(ctx, e.ID)
		if err != nil {
			return given, err
		}
		back, err := s.cfg.Gate.Settle(ctx, p, committed, e.Lines)
		if err != nil {
			return given, err
		}
		if back && !committed {
			given++
			s.metrics.gate.WithLabelValues("back_checked").Inc()
			s.log.Info("gate take given back by the back-check", "tag", p.Tag, "id", e.ID)
		}
	}
	return given, nil
}

// Reconcile sets gate counters that nothing is in flight on to MySQL's
// stock: a give-back lost with its replica (a hold cancelled, then the
// replica died) or stock added in MySQL outside PUT. The counter is
// written only if it did not change while MySQL was read, so it never
// admits more than MySQL holds. Not under guard none: that is the peers'
// trusting configuration, in which the gate is the truth during the sale,
// and the lab shows what it costs when the gate's Redis loses writes.
func (s *Service) Reconcile(ctx context.Context) error {
	if s.cfg.Gate == nil || !s.cfg.Guard.Checks() {
		return nil
	}
	skus, err := s.cfg.Gate.SKUs(ctx, reconcileBatch)
	if err != nil {
		return err
	}
	for _, sku := range skus {
		c, ok, err := s.cfg.Gate.Counter(ctx, sku)
		if err != nil {
			return err
		}
		if !ok || c.Held != 0 {
			continue
		}
		inv, err := s.store.Inventory(ctx, sku)
		if err != nil {
			return err
		}
		if c.Stock == inv.Stock {
			continue
		}
		if _, err := s.cfg.Gate.Reconcile(ctx, sku, inv.Stock, c.Seq); err != nil {
			return err
		}
	}
	return nil
}
