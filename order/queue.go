package order

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/storage"
)

// Accept queue (docs/design.md "Accepting an order (OVERSOLD_ACCEPT)"):
// with Config.Queue set, an order is answered 202 pending once one Lua
// script on the gate's Redis has taken its quantity from the SKU's counter
// and appended it to a Redis Stream (inventory.Queue.Accept); its id is
// chosen before. Every replica runs a consumer (consume) in one consumer
// group: it reads up to BatchMax entries, and for each SKU among them
//
//  1. looks up which of them MySQL settled already (a redelivery: their
//     first consumer died, or could not acknowledge, after its commit);
//  2. sells the rest as one batch under the SKU's lock and guard, in one
//     transaction (sell, the flow's steps 3 to 7); each order's outcome
//     row (storage.QueuedOrder) goes into that transaction, and its
//     primary key is what keeps a redelivered order from being written
//     twice;
//  3. records as rejected, with the error code as reason, the orders
//     MySQL refused (out_of_stock once written, a key naming another
//     request);
//  4. settles them on Redis (inventory.Queue.Settle): a confirmed order's
//     take is spent, a rejected one's quantity goes back to the gate, and
//     each entry is acknowledged and deleted, so the stream holds only
//     what is not settled: it stays as long as the backlog.
//
// An order whose write failed otherwise (a version conflict past its
// retries, a lock timeout, MySQL or the lock service down) stays pending:
// entries pending to any consumer for claimIdle are claimed by the next
// consumer that looks (XAUTOCLAIM, every claimEvery), its own included.
// Nothing is acknowledged before MySQL holds the order's outcome, so a
// replica that dies or stops loses no accepted order: what it had read is
// claimed by another replica within claimIdle plus claimEvery.

// OrderQueue is the order queue (inventory.Queue); nil in Config: accept
// sync.
type OrderQueue interface {
	Accept(ctx context.Context, o inventory.Queued, checked bool) (existing string, err error)
	Lookup(ctx context.Context, id string) (inventory.Queued, bool, error)
	Group(ctx context.Context) error
	Read(ctx context.Context, consumer string, count int, block time.Duration) ([]inventory.Delivery, error)
	Claim(ctx context.Context, consumer string, idle time.Duration, count int) ([]inventory.Delivery, error)
	Settle(ctx context.Context, sku string, settled []inventory.Settled, keep time.Duration) error
	Drop(ctx context.Context, entry string) error
}

// Order statuses besides storage's confirmed.
const (
	StatusPending  = "pending"
	StatusRejected = storage.StatusRejected
)

const (
	// queueBlock is how long one read waits for entries: the consumer
	// looks at its stop signal and its claims this often when idle.
	queueBlock = 500 * time.Millisecond
	// claimEvery is how often a consumer looks for entries to claim.
	claimEvery = time.Second
	// queueRetryPause is the pause after a failed read or claim.
	queueRetryPause = 200 * time.Millisecond
)

// claimIdle is how long an entry stays pending to its consumer before
// another may claim it: longer than one batch can take (the lock wait,
// the batch's reads and work, its write, its settling), so a live consumer
// is not raced. A claim of a live consumer's entry would still write
// nothing twice; it would only be wasted.
func (s *Service) claimIdle() time.Duration {
	if s.cfg.ClaimIdle > 0 {
		return s.cfg.ClaimIdle
	}
	return s.cfg.LockWait + s.batchBound(s.cfg.BatchMax) + writeTimeout + 2*afterCommitTimeout
}

// keyKeep is how long a key's marker outlives its order's settle on
// Redis: longer than a request takes from its MySQL lookup of the key to
// its accept, so a replay racing the settle finds the order by one or the
// other.
func (s *Service) keyKeep() time.Duration { return 2 * s.cfg.RequestTimeout }

// placeQueued is Place with accept queue: the order is pending once taken
// and appended, or the order its key names already.
func (s *Service) placeQueued(ctx context.Context, req Request) (Order, bool, error) {
	q := inventory.Queued{
		ID: uuid.Must(uuid.NewV7()).String(), SKU: req.SKU, Quantity: req.Quantity, Key: req.Key,
		Instance: s.cfg.Instance, AcceptedAt: time.Now().UnixMicro(),
	}
	lines := []inventory.Line{{SKU: req.SKU, Quantity: req.Quantity}}
	checked, seeded := false, false
	for {
		// A key the gate may know is looked up in MySQL (gate.go).
		if checked {
			if o, replayed, err := s.replayQueued(ctx, req); !errors.Is(err, storage.ErrNotFound) {
				return o, replayed, err
			}
		}
		gctx, cancel := context.WithTimeout(ctx, gateTimeout)
		existing, err := s.cfg.Queue.Accept(gctx, q, checked)
		cancel()
		switch {
		case err == nil && existing != "": // the key's order, queued or just settled
			o, err := s.orderView(ctx, existing)
			if err != nil {
				return Order{}, false, err
			}
			return sameRequest(o, req)
		case err == nil:
			s.metrics.queue.WithLabelValues("accepted").Inc()
			return s.pendingView(q), false, nil
		case errors.Is(err, inventory.ErrShort):
			s.metrics.gate.WithLabelValues("short").Inc()
			return Order{}, false, fmt.Errorf("%w (gate): %w", storage.ErrOutOfStock, err)
		case errors.Is(err, inventory.ErrKnown), errors.Is(err, inventory.ErrCheck):
			if errors.Is(err, inventory.ErrCheck) {
				s.gateKeys(ctx, true)
			}
			checked = true
		case errors.Is(err, inventory.ErrUnseeded) && !seeded:
			seeded = true
			if err := s.gateSeed(ctx, lines); err != nil {
				return Order{}, false, err
			}
		case ctx.Err() != nil:
			return Order{}, false, ctx.Err()
		default:
			return Order{}, false, fmt.Errorf("%w: order queue: %w", ErrUnavailable, err)
		}
	}
}

// replayQueued answers a request whose key MySQL knows: the order it
// names, confirmed or rejected (or still pending: the key's marker
// expired, the order did not settle), ErrKeyReused for a reservation's
// key or another body; storage.ErrNotFound for a key MySQL does not know.
func (s *Service) replayQueued(ctx context.Context, req Request) (Order, bool, error) {
	k, err := s.queued.KeyRef(ctx, req.Key)
	if err != nil {
		return Order{}, false, err
	}
	if k.Kind != storage.KindOrder {
		return Order{}, false, fmt.Errorf("key names %s %s: %w", k.Kind, k.Ref, ErrKeyReused)
	}
	o, err := s.orderView(ctx, k.Ref)
	if err != nil {
		return Order{}, false, err
	}
	return sameRequest(o, req)
}

// sameRequest is the replay of o for req, or ErrKeyReused when req asks
// for something else.
func sameRequest(o Order, req Request) (Order, bool, error) {
	if o.SKU != req.SKU || o.Quantity != req.Quantity {
		return Order{}, false, fmt.Errorf("key names order %s: %w", o.ID, ErrKeyReused)
	}
	return o, true, nil
}

// orderView is the order id as GET shows it. With the queue: pending while
// Redis holds it queued, then confirmed (its row in orders) or rejected.
// Redis is read first: an order leaves it only once MySQL holds its
// outcome, so no order is missed between the two reads.
func (s *Service) orderView(ctx context.Context, id string) (Order, error) {
	if s.cfg.Queue != nil {
		q, ok, err := s.cfg.Queue.Lookup(ctx, id)
		if err != nil {
			return Order{}, fmt.Errorf("%w: order queue: %w", ErrUnavailable, err)
		}
		if ok {
			return s.pendingView(q), nil
		}
	}
	o, err := s.queued.Order(ctx, id)
	if err == nil {
		return fromStorage(o), nil
	}
	if !errors.Is(err, storage.ErrNotFound) || s.cfg.Queue == nil {
		return Order{}, err
	}
	r, err := s.queued.QueuedOrder(ctx, id)
	if err != nil {
		return Order{}, err
	}
	if r.Status != storage.StatusRejected { // confirmed, its order row gone: not ours to show
		return Order{}, fmt.Errorf("order %s: %w", id, storage.ErrNotFound)
	}
	return Order{ID: r.ID, SKU: r.SKU, Quantity: r.Quantity, Status: r.Status, Reason: r.Reason,
		Instance: r.Instance, Lock: r.Lock, CreatedAt: r.CreatedAt.UTC()}, nil
}

func (s *Service) pendingView(q inventory.Queued) Order {
	return Order{ID: q.ID, SKU: q.SKU, Quantity: q.Quantity, Status: StatusPending,
		Instance: q.Instance, Lock: s.cfg.Lock, CreatedAt: time.UnixMicro(q.AcceptedAt).UTC()}
}

// consume reads and writes the queue until Close, or until this replica
// withdraws. A batch under way finishes (bounded); what was read and not
// settled stays pending, for another replica to claim.
func (s *Service) consume() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
		case <-s.withdrawn:
		case <-ctx.Done():
		}
		cancel()
	}()
	// Reads and claims are not cancelled by ctx: one cut short may have
	// been given entries, which would then wait for another claim. Each
	// ends within its own bound.
	var claimed time.Time
	for ctx.Err() == nil {
		var ds []inventory.Delivery
		var err error
		if time.Since(claimed) >= claimEvery {
			claimed = time.Now()
			cctx, ccancel := context.WithTimeout(context.Background(), gateTimeout)
			ds, err = s.cfg.Queue.Claim(cctx, s.cfg.Instance, s.claimIdle(), s.cfg.BatchMax)
			ccancel()
			if len(ds) > 0 {
				s.metrics.queue.WithLabelValues("claimed").Add(float64(len(ds)))
				s.log.Info("queue entries claimed", "entries", len(ds))
			}
		}
		if err == nil && len(ds) == 0 {
			rctx, rcancel := context.WithTimeout(context.Background(), queueBlock+gateTimeout)
			ds, err = s.cfg.Queue.Read(rctx, s.cfg.Instance, s.cfg.BatchMax, queueBlock)
			rcancel()
		}
		if err != nil {
			s.log.Warn("queue read failed", "err", err)
			clock.Sleep(ctx, queueRetryPause)
			continue
		}
		s.writeQueued(ds)
	}
}

// writeQueued writes and settles delivered entries, each SKU's as a batch
// of its own, the SKUs at once.
func (s *Service) writeQueued(ds []inventory.Delivery) {
	bySKU := map[string][]inventory.Delivery{}
	for _, d := range ds {
		if d.Err != nil { // not an order this code wrote: nothing to settle
			s.log.Error("queue entry unreadable: dropped", "entry", d.Entry, "err", d.Err)
			ctx, cancel := context.WithTimeout(context.Background(), gateTimeout)
			if err := s.cfg.Queue.Drop(ctx, d.Entry); err != nil {
				s.log.Warn("queue drop failed", "entry", d.Entry, "err", err)
			}
			cancel()
			continue
		}
		bySKU[d.Order.SKU] = append(bySKU[d.Order.SKU], d)
	}
	var wg sync.WaitGroup
	for sku, batch := range bySKU {
		wg.Go(func() { s.writeSKU(sku, batch) })
	}
	wg.Wait()
}

// writeSKU writes one SKU's delivered orders and settles them, retrying
// those whose write failed up to maxAttempts times with backoff; the rest
// stay pending for a claim. Without a lock, retries sell each order alone:
// the atomic guard refuses a batch's sum on a stale read where each order
// still fits.
func (s *Service) writeSKU(sku string, ds []inventory.Delivery) {
	for attempt := 1; len(ds) > 0; attempt++ {
		var settled []inventory.Settled
		settled, ds = s.writeBatch(sku, ds, attempt > 1 && s.locker == nil)
		if len(settled) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), afterCommitTimeout)
			err := s.cfg.Queue.Settle(ctx, sku, settled, s.keyKeep())
			cancel()
			if err != nil { // MySQL holds their outcome: a claim settles them
				s.log.Warn("queue settle failed: left to a claim", "sku", sku, "orders", len(settled), "err", err)
			} else {
				s.countSettled(settled)
			}
		}
		if len(ds) == 0 || attempt == maxAttempts {
			break
		}
		if err := clock.Sleep(context.Background(), rand.N(min(retryBase<<attempt, retryCap))); err != nil {
			break
		}
	}
	if len(ds) > 0 {
		s.log.Warn("queued orders left pending for a claim", "sku", sku, "orders", len(ds))
	}
}

func (s *Service) countSettled(settled []inventory.Settled) {
	for _, st := range settled {
		outcome := "confirmed"
		if !st.Confirmed {
			outcome = "rejected"
		}
		s.metrics.queue.WithLabelValues(outcome).Inc()
	}
}

// writeBatch is steps 1 to 3 for one SKU's orders: it returns those whose
// outcome MySQL now holds, and those to try again.
func (s *Service) writeBatch(sku string, ds []inventory.Delivery, solo bool) (settled []inventory.Settled, again []inventory.Delivery) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.LockWait+s.batchBound(len(ds)))
	defer cancel()
	// 1. what MySQL settled already
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.Order.ID
	}
	prev, err := s.queued.QueuedOrders(ctx, ids)
	if err != nil {
		s.log.Warn("queued outcomes unread", "sku", sku, "err", err)
		return nil, ds
	}
	var todo []inventory.Delivery
	for _, d := range ds {
		if r, ok := prev[d.Order.ID]; ok {
			s.metrics.queue.WithLabelValues("redelivered").Inc()
			settled = append(settled, inventory.Settled{Delivery: d, Confirmed: r.Status == storage.StatusConfirmed})
		} else {
			todo = append(todo, d)
		}
	}
	// 2. the batch under the SKU's lock and guard, in one transaction
	groups := [][]inventory.Delivery{todo}
	if solo {
		groups = nil
		for _, d := range todo {
			groups = append(groups, []inventory.Delivery{d})
		}
	}
	for _, g := range groups {
		if len(g) == 0 {
			continue
		}
		done, rest := s.sellQueued(ctx, sku, g)
		settled, again = append(settled, done...), append(again, rest...)
	}
	return settled, again
}

// sellQueued sells ds as one batch and returns the orders whose outcome
// MySQL holds, confirmed or (step 3) rejected.
func (s *Service) sellQueued(ctx context.Context, sku string, ds []inventory.Delivery) (settled []inventory.Settled, again []inventory.Delivery) {
	lines := make([]*line, len(ds))
	for i, d := range ds {
		lines[i] = &line{req: Request{SKU: d.Order.SKU, Quantity: d.Order.Quantity, Key: d.Order.Key,
			id: d.Order.ID, queued: true, acceptedAt: time.UnixMicro(d.Order.AcceptedAt)}}
	}
	alone := len(lines) == 1
	if s.locker != nil {
		lease, err := s.acquire(ctx, sku)
		if err != nil {
			s.log.Warn("queued batch: lock not granted", "sku", sku, "err", err)
			return nil, ds
		}
		held := s.hold(lease)
		s.metrics.batchSize.Observe(float64(len(lines)))
		s.sell(ctx, lease, lines, false)
		s.release(ctx, lease, held)
		alone = true // a short order under the lock was refused on MySQL's committed stock
	} else {
		s.sell(ctx, nil, lines, false)
	}
	for i, l := range lines {
		d := ds[i]
		var reason string
		switch err := l.out.err; {
		case err == nil && l.out.order.ID == l.req.id:
			settled = append(settled, inventory.Settled{Delivery: d, Confirmed: true})
			continue
		case err == nil: // its key names another order
			reason = "idempotency_key_reused"
		case errors.Is(err, storage.ErrOutOfStock) && alone,
			errors.Is(err, ErrKeyReused), errors.Is(err, storage.ErrUnknownSKU):
			_, reason, _, _ = classify(err)
		default:
			again = append(again, d)
			continue
		}
		r, err := s.reject(ctx, d.Order, reason)
		if err != nil {
			s.log.Warn("queued order's rejection unwritten", "order_id", d.Order.ID, "err", err)
			again = append(again, d)
			continue
		}
		settled = append(settled, inventory.Settled{Delivery: d, Confirmed: r.Status == storage.StatusConfirmed})
	}
	return settled, again
}

// reject records the order as rejected, unless it has an outcome already:
// the one that holds is returned.
func (s *Service) reject(ctx context.Context, q inventory.Queued, reason string) (storage.QueuedOrder, error) {
	ctx, cancel := afterCommit(ctx)
	defer cancel()
	r := storage.QueuedOrder{ID: q.ID, SKU: q.SKU, Quantity: q.Quantity, Reason: reason,
		Instance: s.cfg.Instance, Lock: s.cfg.Lock, CreatedAt: time.UnixMicro(q.AcceptedAt).UTC()}
	if q.Key != "" {
		r.IdempotencyKey = &q.Key
	}
	r, err := s.queued.RejectQueued(ctx, r)
	if err == nil && r.Status == storage.StatusRejected {
		s.log.Info("queued order rejected", "order_id", q.ID, "sku", q.SKU, "reason", r.Reason)
	}
	return r, err
}
