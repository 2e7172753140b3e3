package order

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sync/singleflight"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/storage"
)

const (
	// DefaultLockWait is Config.LockWait's default, as OVERSOLD_LOCK_WAIT's.
	DefaultLockWait = 5 * time.Second
	// maxAttempts bounds the version guard's retries of the whole flow.
	maxAttempts = 8
	// Retries back off with full jitter from retryBase, doubling, capped:
	// replicas that conflicted once should not meet again in lockstep.
	retryBase = 5 * time.Millisecond
	retryCap  = 250 * time.Millisecond
	// afterCommitTimeout bounds steps 7 and 8, which run on a context of
	// their own (see afterCommit).
	afterCommitTimeout = 5 * time.Second
	// writeTimeout bounds step 6, which runs on a context that outlives
	// the client's: a commit is never cut short because a client or a
	// balancer gave up waiting, and its outcome is known before we answer.
	writeTimeout = 10 * time.Second
	// loadTimeout bounds a MySQL read shared by several requests.
	loadTimeout = 5 * time.Second
	// maxKnownSKUs caps the SKUs a replica remembers to exist; past it,
	// the existence check before the lock reads MySQL each time.
	maxKnownSKUs = 100_000
)

// Config is one replica's settings.
type Config struct {
	Instance string        // replica name in orders, logs and metrics
	Lock     string        // the lock backend's name; "none" with a nil Locker
	Guard    storage.Guard // "" = version
	// LockWait is the longest wait for the lock (0 = DefaultLockWait).
	LockWait time.Duration
	// WorkDelay is simulated business logic inside the critical section,
	// per order (a batch of n orders under a lock works n times as long;
	// without a lock its orders work side by side: see Service.work).
	WorkDelay time.Duration
	// BatchMax is the most orders of one SKU sold under one lease and in
	// one transaction (0 = DefaultBatchMax; 1 = no coalescing).
	BatchMax int
	// BatchWait is how long a batch waits for more orders once its lock is
	// granted (0: a batch is what queued until the grant).
	BatchWait time.Duration
	// ReservationTTL is a hold's time when the request names none (0 =
	// DefaultReservationTTL).
	ReservationTTL time.Duration
	// SweepInterval is how often the sweeper runs (0 = DefaultSweepInterval).
	SweepInterval time.Duration
	// AdminToken is the bearer token of the admin routes; "" disables them.
	AdminToken string
	// MaxInFlight caps the API requests served at once; the rest are
	// answered 503 at once (0 = DefaultMaxInFlight). See limit.go.
	MaxInFlight int
	// RequestTimeout bounds each API request (0 = DefaultRequestTimeout).
	RequestTimeout time.Duration
	Logger         *slog.Logger // nil: no logs
	Metrics        *Metrics     // nil: NewMetrics(Instance, Lock, Guard)
	// Observers are told of each step after the replica's metrics and
	// logs (observe.go): orderd's lab build adds the lab's fault hook here,
	// which waits at the Hook* points so the lab can pause or kill the
	// replica at an exact step of the flow.
	Observers []Observer
	// Gate is the stock gate (gate.go); nil: OVERSOLD_GATE=none.
	Gate StockGate
	// Queue is the order queue (queue.go), on the gate's Redis; nil:
	// OVERSOLD_ACCEPT=sync. It needs Gate.
	Queue OrderQueue
	// ClaimIdle is how long a queue entry stays pending to a consumer
	// before another claims it (0: longer than a batch can take; see
	// claimIdle).
	ClaimIdle time.Duration
}

// HookPoint names a step of the flow told to the observers. The Hook*
// constants are the lab's fault points (HookPoint.Fault).
type HookPoint string

const (
	// HookAfterRead: the lease is held and the stock read (steps 2 to 4
	// done), before step 5's work and before the Lost check: a holder
	// kept here while its renewals fail must find its lease lost at the
	// check and abort without writing.
	HookAfterRead HookPoint = "after-read"
	// HookBeforeWrite: the lease is held, the stock read, step 5 done and
	// the one Lost check passed; nothing is written yet. A pause here is
	// Kleppmann's GC pause: the holder resumes past its lease and writes
	// anyway, which no check made before the pause can see.
	HookBeforeWrite HookPoint = "before-write"
	// HookBeforeCommit: inside step 6's transaction, after the guarded
	// write and the order insert, just before COMMIT (the lab kills
	// connections here).
	HookBeforeCommit HookPoint = "before-commit"
	// HookBeforeCache: step 6 committed, step 7's cache update not done
	// yet: a holder paused here leaves the cache behind MySQL, the limit of
	// the fencing guard that docs/design.md admits.
	HookBeforeCache HookPoint = "before-cache"
	// HookAfterCommit: step 6 committed and step 7 done, before the
	// release and the reply.
	HookAfterCommit HookPoint = "after-commit"
	// HookHoldAfterCommit: a reservation's hold committed and cached,
	// before the release and the reply (the lab kills the replica here).
	HookHoldAfterCommit HookPoint = "hold-after-commit"
	// HookSettleBeforeWrite: a confirm, cancel or expiry holds its SKUs'
	// leases, read the reservation held and the rows, and passed its Lost
	// check; its transaction is next (the lab pauses a sweeper here, or
	// holds a confirm until the reservation's expires_at).
	HookSettleBeforeWrite HookPoint = "settle-before-write"
)

// HookInfo is what a step tells the observers about the order.
type HookInfo struct {
	SKU   string
	Key   string // Idempotency-Key, or ""
	Token uint64 // the lease's fencing token, 0 without one
	// Reservation and Op, at the reservation hook points: its id, and
	// hold, confirm, cancel or expire. Token is then the highest of the
	// SKUs' tokens, or the sweeper's for an expiry.
	Reservation string
	Op          string
}

// Service is one replica of the order service. Its methods are safe for
// concurrent use.
type Service struct {
	store   FlowStore // the order flow's MySQL (store.go)
	cache   Cache
	locker  Locker // nil: lock=none, steps 2 and 8 skipped
	cfg     Config
	log     *slog.Logger
	metrics *Metrics
	admin   [sha256.Size]byte // hash of the admin token, for a constant-time compare
	handler http.Handler

	// observers are told of each step: metrics, logs, Config.Observers.
	observers []Observer

	// The other parts' MySQL (store.go).
	holds     ReservationStore
	sweeps    SweepStore
	queued    QueueStore
	readiness ReadinessStore

	queues queues             // orders waiting for their SKU's batch (batch.go)
	loads  singleflight.Group // concurrent reads of one SKU share one query
	skus   knownSKUs          // SKUs seen in MySQL: they are never deleted

	// epoch is the fence epoch of this replica's settings
	// (storage.Store.AdoptFences), carried with the token by every fenced
	// write.
	epoch atomic.Uint64
	// lockID is the identity of the lock servers' data
	// (locking.IdentityOf), read once by Start: the fences are this
	// replica's while they name cfg.Lock and it.
	lockID atomic.Pointer[string]
	// withdrawn is closed when this replica withdraws, superseded by
	// another fleet (ready.go): its sweeper stops.
	withdrawn chan struct{}
	// whyWithdrawn is set before withdrawn is closed: /readyz's answer.
	whyWithdrawn error

	// sweepFrom is where the next sweep pass reads on from: past the due
	// holds the last pass read, when it ended on its bound (sweeper.go).
	sweepFrom struct {
		sync.Mutex
		after storage.Reservation
	}

	// keysLoad lets one request at a time load MySQL's keys into the
	// gate's key set, and when that failed (gate.go).
	keysLoad struct {
		sync.Mutex
		failed time.Time
	}

	stopOnce  sync.Once
	stop      chan struct{} // ends the heartbeat
	heartbeat sync.WaitGroup
}

// New returns a replica of the order service. locker is nil for lock=none.
func New(store Store, cache Cache, locker Locker, cfg Config) *Service {
	if locker == nil {
		cfg.Lock = "none"
	}
	if cfg.Guard == "" {
		cfg.Guard = storage.GuardVersion
	}
	if cfg.LockWait <= 0 {
		cfg.LockWait = DefaultLockWait
	}
	if cfg.ReservationTTL <= 0 {
		cfg.ReservationTTL = DefaultReservationTTL
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	if cfg.BatchMax <= 0 {
		cfg.BatchMax = DefaultBatchMax
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(cfg.Instance, cfg.Lock, cfg.Guard)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Service{
		store:     store,
		holds:     store,
		sweeps:    store,
		queued:    store,
		readiness: store,
		cache:     cache,
		locker:    locker,
		cfg:       cfg,
		log:       log.With("instance", cfg.Instance),
		metrics:   cfg.Metrics,
		admin:     sha256.Sum256([]byte(cfg.AdminToken)),
		stop:      make(chan struct{}),
		withdrawn: make(chan struct{}),
		queues:    queues{m: map[string][]*pending{}},
	}
	s.observers = append([]Observer{cfg.Metrics, logObserver{s.log}}, cfg.Observers...)
	s.handler = s.routes()
	return s
}

// Handler is the HTTP API.
func (s *Service) Handler() http.Handler { return s.handler }

// Place places an order, running the flow of docs/design.md. replayed reports an
// order placed earlier with the same key. A version conflict retries the
// whole flow, from the replay check on, up to maxAttempts times.
func (s *Service) Place(ctx context.Context, req Request) (o Order, replayed bool, err error) {
	if err := s.refuseIfWithdrawn(); err != nil {
		return Order{}, false, err
	}
	if s.cfg.Queue != nil {
		return s.placeQueued(ctx, req) // queue.go
	}
	if s.cfg.Gate != nil {
		return s.placeGated(ctx, req) // gate.go
	}
	return s.place(ctx, req)
}

// place is Place past the gate.
func (s *Service) place(ctx context.Context, req Request) (o Order, replayed bool, err error) {
	for attempt := 1; ; attempt++ {
		o, replayed, err = s.placeOnce(ctx, req)
		if errors.Is(err, storage.ErrOutOfStock) && req.Key != "" {
			// A retry that raced its own first try (both past step 1
			// before either committed) finds the stock that try took: it
			// is a replay, not a refusal.
			if prev, again, lerr := s.replayOrder(ctx, req); lerr == nil || errors.Is(lerr, ErrKeyReused) {
				return prev, again, lerr
			}
		}
		if !errors.Is(err, storage.ErrConflict) || attempt == maxAttempts {
			return o, replayed, err
		}
		backoff := rand.N(min(retryBase<<attempt, retryCap))
		if err := clock.Sleep(ctx, backoff); err != nil {
			return Order{}, false, err
		}
	}
}

// placeOnce is steps 1 to 8, once. Without a lock the order is a batch of
// its own; under a lock it joins its SKU's queue (batch.go), and every
// order that queued while the lock was held or being acquired is sold in
// one batch: one acquisition, one transaction.
func (s *Service) placeOnce(ctx context.Context, req Request) (Order, bool, error) {
	// 1. replay
	if req.Key != "" {
		if o, replayed, err := s.replayOrder(ctx, req); !errors.Is(err, storage.ErrNotFound) {
			return o, replayed, err
		}
	}
	if s.locker == nil {
		l := &line{req: req}
		s.sell(ctx, nil, []*line{l}, false)
		r := s.result(l)
		return r.order, r.replayed, r.err
	}
	// No lock, and no lock state on any server, for a SKU that does not
	// exist: random SKUs must not grow Redis keys or lock rows.
	if err := s.exists(ctx, req.SKU); err != nil {
		return Order{}, false, err
	}
	return s.enqueue(ctx, req) // steps 2 to 8, in the SKU's next batch
}

// outcome is one order's answer.
type outcome struct {
	order    Order
	replayed bool
	err      error
}

// line is one order of a batch: its request and, once known, its answer.
type line struct {
	req Request
	out outcome
}

// answered reports whether the line has its answer.
func (l *line) answered() bool { return l.out.err != nil || l.out.order.ID != "" }

// answer gives each line the answer err.
func answer(lines []*line, err error) {
	for _, l := range lines {
		l.out = outcome{err: err}
	}
}

// sell is steps 3 to 7 for orders of one SKU, all under lease (nil: no
// lock, and one order): one stock read, the orders filled in arrival order
// while the stock lasts, one transaction with every filled order and one
// guarded stock write. It answers every line of the batch. ctx bounds the
// reads; the write runs on a context the clients cannot cancel. fresh
// reads the stock from MySQL, not the cache.
func (s *Service) sell(ctx context.Context, lease locking.Lease, batch []*line, fresh bool) {
	sku, first := batch[0].req.SKU, batch[0].req
	// A retry's lines may still carry the answers of the try before: none
	// of them holds once the batch sells again.
	answer(batch, nil)

	item, err := s.readStock(ctx, sku, lease, batch, fresh) // steps 3 and 4
	if err != nil {
		answer(batch, err)
		return
	}
	filled, short := fill(batch, item.Stock)
	outOfStock := fmt.Errorf("%q: %w", sku, storage.ErrOutOfStock)
	if len(filled) == 0 {
		// Each asks for more than MySQL's stock (a batch short of stock
		// read it there): the committed truth.
		answer(short, outOfStock)
		return
	}
	// The short orders were refused against what the filled ones leave:
	// that is the truth only once those commit. Until then they share the
	// batch's outcome.

	s.hook(ctx, HookAfterRead, first, lease)
	if err := s.readyToWrite(ctx, sku, lease, len(filled)); err != nil { // step 5
		answer(batch, err)
		return
	}
	s.hook(ctx, HookBeforeWrite, first, lease)

	// 6. the guarded write and the orders, in one transaction, on a
	// context the clients cannot cancel: its outcome is settled before
	// anyone is answered.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	orders := make([]storage.Order, len(filled))
	for j, l := range filled {
		orders[j] = s.newOrder(l.req, lease)
	}
	inv, err := s.write(wctx, orders, item, lease, first)
	s.observe(ctx, Event{At: StepWritten, HookInfo: HookInfo{SKU: first.SKU, Token: orders[0].Token}, Orders: len(orders), Err: err})
	if err != nil {
		s.writeRefused(ctx, wctx, lease, batch, filled, short, orders, fresh, outOfStock, err)
		return
	}
	s.hook(ctx, HookBeforeCache, first, lease)

	// 7. the cache takes the new stock. The orders are committed whatever
	// happens here: a failure leaves an older entry, which the version
	// guard refuses and refreshes, and which expires.
	s.cacheWrite(wctx, toItem(inv), lease)
	s.hook(ctx, HookAfterCommit, first, lease)
	for j, l := range filled {
		l.out = outcome{order: fromStorage(orders[j])}
	}
	answer(short, outOfStock) // the stock they lacked is committed now
}

// readStock is steps 3 and 4: the stock from the cache (from MySQL if
// fresh), confirmed by MySQL when the cache says there is not enough.
func (s *Service) readStock(ctx context.Context, sku string, lease locking.Lease, batch []*line, fresh bool) (inventory.Item, error) {
	// 3. stock from the cache
	read := s.stock
	if fresh {
		read = s.confirm
	}
	item, err := read(ctx, sku, lease)
	if err != nil {
		return item, err
	}

	// 4. enough? A cache entry that says no is confirmed by MySQL: stock
	// added there outside PUT must be sold.
	if !fresh && demand(batch) > item.Stock {
		return s.confirm(ctx, sku, lease)
	}
	return item, nil
}

// work is how long the business logic of a batch of n orders takes (step
// 5). Inside a lease's critical section the orders work one after another:
// n times WorkDelay. Without a lock nothing makes them wait for each other
// (a queued batch under lock none; a synchronous order is a batch of one),
// so they work side by side, as the synchronous lock-free orders do, each
// in its own request: one WorkDelay. Only their write is shared.
func (s *Service) work(locked bool, n int) time.Duration {
	if !locked {
		return s.cfg.WorkDelay
	}
	return time.Duration(n) * s.cfg.WorkDelay
}

// readyToWrite is step 5 and the checks before the write: the business
// logic of n orders, the lease not known lost, the batch's bound not past,
// and the cache entry gone where the guard builds on it.
func (s *Service) readyToWrite(ctx context.Context, sku string, lease locking.Lease, n int) error {
	// 5. business logic: each order's own.
	if err := clock.Sleep(ctx, s.work(lease != nil, n)); err != nil {
		return err
	}

	// A lease known to be lost must not write. This is the only check, made
	// once, right before the write: a check can only narrow the window,
	// never close it. A holder paused (GC, SIGSTOP, a slow network) right
	// after any check, even one just before COMMIT, still writes with a
	// lost lease (Kleppmann, "How to do distributed locking", 2016); that is
	// what the guards in step 6 are for.
	if err := s.beforeWrite(lost(lease), "write"); err != nil {
		return err
	}
	// No write starts past the batch's (or the request's) bound: a taken
	// order's answer is due within Service.WriteTimeout, which counts on
	// it. (Checked after the Lost check, whose answer says more, and
	// before the fault hook: the lab's pauses there must still end in a
	// write, as a real pause would.)
	if err := ctx.Err(); err != nil {
		return err
	}
	// The none and fencing guards build on the cached read, so the entry
	// goes before the write: a holder killed or paused between its commit
	// and step 7 then leaves the next holder a miss (a read of MySQL), not
	// a stale stock that its own write would build on (under none: an
	// oversell; under fencing, which also checks the version read: a
	// refused write and a retry). The version and atomic guards check the
	// read in MySQL and need no such care.
	if s.trustsCache() {
		if err := s.cache.Invalidate(ctx, sku); err != nil {
			return fmt.Errorf("%w: guard %s needs the stock cache: %w", ErrUnavailable, s.cfg.Guard, err)
		}
	}
	return nil
}

// writeRefused answers a batch whose write (step 6) failed with err, or
// sells again the lines that may still be sold.
func (s *Service) writeRefused(ctx, wctx context.Context, lease locking.Lease, batch, filled, short []*line, orders []storage.Order, fresh bool, outOfStock, err error) {
	again := s.refused(wctx, batch, filled, orders, lease, err)
	switch {
	case len(again) > 0: // a duplicate key's bystanders
		s.sell(ctx, lease, again, fresh)
	case errors.Is(err, storage.ErrOutOfStock) && lease != nil && !fresh:
		// The atomic guard refused the batch's sum on a cached stock
		// behind MySQL: some orders may still fit. Sell them all again,
		// once, on MySQL's stock (the lease is still ours).
		s.sell(ctx, lease, batch, true)
	case filled[0].out.order.ID != "": // the write committed after all
		answer(short, outOfStock)
	default:
		// Nothing was written: an out_of_stock would be refused on a
		// stock the batch did not take (a history check would call it
		// non-linearizable).
		answer(short, filled[0].out.err)
	}
}

// demand is the quantity the lines ask for.
func demand(lines []*line) int64 {
	var q int64
	for _, l := range lines {
		q += l.req.Quantity
	}
	return q
}

// fill takes the orders in arrival order while stock lasts, as they would
// be sold one after the other: an order that does not fit is short, and a
// smaller one after it may still fit.
func fill(batch []*line, stock int64) (filled, short []*line) {
	for _, l := range batch {
		if l.req.Quantity <= stock {
			stock -= l.req.Quantity
			filled = append(filled, l)
		} else {
			short = append(short, l)
		}
	}
	return filled, short
}

// replayOrder answers an order request by what its key names already:
// the order placed under it (replay), ErrKeyReused for a reservation held
// under it (a key names one request, of either kind), storage.ErrNotFound
// for a new key. The write's claim of the key (storage.PlaceOrder) is what
// enforces it; this read answers without taking a lock.
func (s *Service) replayOrder(ctx context.Context, req Request) (Order, bool, error) {
	prev, err := s.store.OrderByKey(ctx, req.Key)
	if err == nil {
		return replay(prev, req)
	}
	if !errors.Is(err, storage.ErrNotFound) {
		return Order{}, false, err
	}
	r, rerr := s.store.ReservationByKey(ctx, req.Key)
	switch {
	case rerr == nil:
		return Order{}, false, fmt.Errorf("key names reservation %s: %w", r.ID, ErrKeyReused)
	case errors.Is(rerr, storage.ErrNoReservation):
		return Order{}, false, err
	}
	return Order{}, false, rerr
}

// replay answers a request whose key names an order placed earlier: that
// order, if the request asks for the same thing, else ErrKeyReused.
func replay(prev storage.Order, req Request) (Order, bool, error) {
	if !bytes.Equal(prev.Fingerprint, storage.OrderFingerprint(req.SKU, req.Quantity)) {
		return Order{}, false, fmt.Errorf("key names order %s: %w", prev.ID, ErrKeyReused)
	}
	return fromStorage(prev), true, nil
}

// newOrder is the row step 6 inserts, its id chosen before the write so
// that a write of unknown outcome can be looked up.
func (s *Service) newOrder(req Request, lease locking.Lease) storage.Order {
	id := req.id // chosen before the gate's take
	if id == "" {
		id = uuid.Must(uuid.NewV7()).String()
	}
	o := storage.Order{
		ID:        id,
		SKU:       req.SKU,
		Quantity:  req.Quantity,
		Status:    storage.StatusConfirmed,
		Instance:  s.cfg.Instance,
		Lock:      s.cfg.Lock,
		CreatedAt: time.Now().UTC().Truncate(time.Microsecond), // what MySQL keeps
	}
	if req.queued { // created when accepted
		o.CreatedAt = req.acceptedAt.UTC().Truncate(time.Microsecond)
	}
	if lease != nil {
		o.Token = lease.Token()
	}
	if req.Key != "" {
		o.IdempotencyKey = &req.Key
		o.Fingerprint = storage.OrderFingerprint(req.SKU, req.Quantity)
	}
	return o
}

// write is step 6: the guarded write and the orders in one transaction.
// The lease was checked once before it (sell); there is no second check.
func (s *Service) write(ctx context.Context, orders []storage.Order, seen inventory.Item, lease locking.Lease, first Request) (storage.Inventory, error) {
	w := storage.Write{Guard: s.cfg.Guard, Orders: orders, Stock: seen.Stock, Version: seen.Version, Epoch: s.epoch.Load(), Token: orders[0].Token,
		Decrement: s.cfg.Gate != nil, Queued: first.queued}
	return s.store.PlaceOrder(ctx, w, func() error {
		s.hook(ctx, HookBeforeCommit, first, lease)
		return nil
	})
}

// refused handles a failed step 6 for the filled lines of batch, whose
// rows are orders: nothing was written, or (an error no guard explains) we
// do not know yet. It answers the filled lines, and returns the lines to
// sell again, in arrival order: after a concurrent insert of one of their
// keys, all but the orders of the taken keys.
func (s *Service) refused(ctx context.Context, batch, filled []*line, orders []storage.Order, lease locking.Lease, err error) (again []*line) {
	sku := filled[0].req.SKU
	answer(filled, err)
	// A fresh bounded context: the write's own may be what ran out, and
	// the refresh and the lookups below are what settles the answers.
	ctx, cancel := afterCommit(ctx)
	defer cancel()
	switch {
	case errors.Is(err, storage.ErrConflict):
		// Our read was stale: refresh the cache from MySQL so the retry
		// (after the release) starts from the truth.
		s.refresh(ctx, sku, lease)
	case errors.Is(err, storage.ErrStaleFence):
		answer(filled, fmt.Errorf("%w: %w", ErrLockLost, err))
	case errors.Is(err, storage.ErrOutOfStock):
		s.refresh(ctx, sku, lease) // atomic guard: the cache was behind
	case errors.Is(err, storage.ErrDuplicate):
		// A concurrent request with one of the keys committed first, an
		// order or a hold; the key's claim rolled the whole batch back. The
		// orders whose key is taken now are replays (or reuses) of it; the
		// rest, the short ones too, sell again.
		for _, l := range filled {
			if l.req.Key == "" {
				l.out = outcome{} // sells again
				continue
			}
			o, replayed, lerr := s.replayOrder(ctx, l.req)
			switch {
			case errors.Is(lerr, storage.ErrNotFound):
				l.out = outcome{} // sells again
			default:
				l.out.order, l.out.replayed, l.out.err = o, replayed, lerr
			}
		}
		again = slices.DeleteFunc(slices.Clone(batch), (*line).answered)
		if len(again) == len(batch) { // no key was taken: not ours to explain
			answer(filled, err)
			return nil
		}
		return again
	case errors.Is(err, ErrLockLost), errors.Is(err, storage.ErrUnknownSKU):
		// Nothing reached MySQL, or there is nothing to cache.
	default:
		// The write's outcome is unknown: a connection lost during COMMIT
		// may have committed it. MySQL decides: the orders' ids were chosen
		// before the write, and the transaction committed all or none.
		// Either way the cache entry must not outlive the doubt, or the
		// next holder trusts a stale stock; the lock is still ours, so the
		// refresh reads what the next holder will see.
		s.refresh(ctx, sku, lease)
		if _, lerr := s.store.Order(ctx, orders[0].ID); lerr == nil {
			s.log.Warn("write reported failed but committed", "sku", sku, "orders", len(orders), "err", err)
			for j, l := range filled {
				l.out = outcome{order: fromStorage(orders[j])}
			}
		}
	}
	return nil
}

// acquire is step 2: wait at most LockWait for the SKU's lock.
func (s *Service) acquire(ctx context.Context, sku string) (locking.Lease, error) {
	wait, cancel := context.WithTimeout(ctx, s.cfg.LockWait)
	defer cancel()
	start := time.Now()
	lease, err := s.locker.Acquire(wait, "sku/"+sku)
	s.observe(ctx, Event{At: StepAcquired, HookInfo: HookInfo{SKU: sku}, Wait: time.Since(start)})
	switch {
	case err == nil:
		return lease, nil
	case ctx.Err() != nil: // the caller left; not the lock's fault
		return nil, err
	case errors.Is(err, context.DeadlineExceeded):
		return nil, fmt.Errorf("%w after %v: %w", ErrLockTimeout, s.cfg.LockWait, err)
	default:
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
}

// release is step 8. It runs last, after the commit if there was one, on a
// context of its own: a lock left behind would block the SKU until its TTL.
func (s *Service) release(ctx context.Context, lease locking.Lease, h *holding) {
	lostAt := h.end(lease)
	released := time.Now() // we stop relying on the lease here, before the server frees it
	ctx, cancel := afterCommit(ctx)
	defer cancel()
	err := lease.Release(ctx)
	s.observe(ctx, Event{At: StepReleased, Err: err, Held: []Held{h.record(lease, lostAt, released)}})
}

// holding is a lease from its grant on: when it was granted and when, if
// ever, the replica saw it lost.
type holding struct {
	granted time.Time
	stop    chan struct{}
	done    chan struct{}
	lostAt  *time.Time // set by the watcher before done closes
}

// hold starts watching lease's Lost until release, so the lease record says
// when the holder learned of the loss: a holder paused past its TTL learns
// it only when it runs again.
func (s *Service) hold(lease locking.Lease) *holding {
	h := &holding{granted: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		select {
		case <-lease.Lost():
			t := time.Now()
			h.lostAt = &t
		case <-h.stop:
		}
	}()
	return h
}

// record is the lease's life for StepReleased.
func (h *holding) record(lease locking.Lease, lostAt *time.Time, released time.Time) Held {
	return Held{Key: lease.Key(), Token: lease.Token(), Granted: h.granted, LostAt: lostAt, Released: released}
}

// end stops the watcher and returns when the lease was seen lost, or nil.
func (h *holding) end(lease locking.Lease) *time.Time {
	close(h.stop)
	<-h.done
	if h.lostAt == nil && lost(lease) { // closed as the watcher stopped
		t := time.Now()
		h.lostAt = &t
	}
	return h.lostAt
}

// hook tells the observers of the order flow's step at.
func (s *Service) hook(ctx context.Context, at HookPoint, req Request, lease locking.Lease) {
	h := HookInfo{SKU: req.SKU, Key: req.Key}
	if lease != nil {
		h.Token = lease.Token()
	}
	s.observe(ctx, Event{At: at, HookInfo: h})
}

// afterCommit returns a context for the work that follows a commit (steps
// 7 and 8): it must be done even when the client has left and cancelled
// the request's context, so it keeps the values but not the cancellation.
func afterCommit(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), afterCommitTimeout)
}

// stock is step 3: the SKU's stock from the cache, or from MySQL when the
// cache cannot be used and the guard does not need it. The version and
// atomic guards check in MySQL what they read, so MySQL's own row serves
// as well. The none and fencing guards trust the read: a replica that
// sells while it cannot update the cache would leave the other replicas
// an entry behind MySQL, so they refuse (503) until Redis is back.
func (s *Service) stock(ctx context.Context, sku string, lease locking.Lease) (inventory.Item, error) {
	item, err := s.cache.Get(ctx, sku, s.loader(sku, lease))
	if !errors.Is(err, inventory.ErrDown) {
		return item, err
	}
	if s.trustsCache() {
		return inventory.Item{}, fmt.Errorf("%w: guard %s needs the stock cache: %w", ErrUnavailable, s.cfg.Guard, err)
	}
	s.metrics.cacheBypassed.Inc()
	return s.loader(sku, lease)(ctx)
}

// trustsCache reports whether the guard builds its write on the cached
// read (storage.Guard.TrustsCache).
func (s *Service) trustsCache() bool { return s.cfg.Guard.TrustsCache() }

// confirm reads the SKU's stock from MySQL when the cache said there was
// not enough, and puts it in the cache.
func (s *Service) confirm(ctx context.Context, sku string, lease locking.Lease) (inventory.Item, error) {
	item, err := s.loader(sku, lease)(ctx)
	if err != nil {
		return inventory.Item{}, err
	}
	s.cacheWrite(ctx, item, lease)
	return item, nil
}

// loader reads a SKU's stock from MySQL. Without a lease, concurrent reads
// of one SKU in this replica share one query (a hot SKU's misses would
// otherwise all reach MySQL at once). A lease holder reads alone, the
// latest commit (storage.InventoryLatest): a shared or plain read may
// predate the previous holder's commit, and the none and fencing guards
// would write on it.
func (s *Service) loader(sku string, lease locking.Lease) func(context.Context) (inventory.Item, error) {
	if lease != nil {
		return func(ctx context.Context) (inventory.Item, error) {
			inv, err := s.store.InventoryLatest(ctx, sku)
			return toItem(inv), err
		}
	}
	return func(ctx context.Context) (inventory.Item, error) { return s.shared(ctx, sku) }
}

// shared is one MySQL read of the SKU for every concurrent caller. It runs
// on a context of its own, so a caller that leaves does not fail the rest.
func (s *Service) shared(ctx context.Context, sku string) (inventory.Item, error) {
	ch := s.loads.DoChan(sku, func() (any, error) {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), loadTimeout)
		defer cancel()
		inv, err := s.store.Inventory(lctx, sku)
		return toItem(inv), err
	})
	select {
	case r := <-ch:
		item, _ := r.Val.(inventory.Item)
		return item, r.Err
	case <-ctx.Done():
		return inventory.Item{}, ctx.Err()
	}
}

// exists checks that the SKU is in MySQL, once per SKU and replica: SKUs
// are never deleted.
func (s *Service) exists(ctx context.Context, sku string) error {
	if s.skus.has(sku) {
		return nil
	}
	if _, err := s.shared(ctx, sku); err != nil {
		return err
	}
	s.skus.add(sku)
	return nil
}

// knownSKUs is a set of SKUs seen in MySQL, capped at maxKnownSKUs.
type knownSKUs struct {
	m sync.Map
	n atomic.Int64
}

func (k *knownSKUs) has(sku string) bool { _, ok := k.m.Load(sku); return ok }

func (k *knownSKUs) add(sku string) {
	if k.n.Load() >= maxKnownSKUs {
		return
	}
	if _, loaded := k.m.LoadOrStore(sku, struct{}{}); !loaded {
		k.n.Add(1)
	}
}

// cacheWrite puts MySQL's stock and version in the cache. A lease holder
// knows item to be the latest (it holds the SKU), so a newer entry is
// stale and goes (Settle); without a lease, writers race and the newest
// wins (Set). A failure is logged: MySQL has the truth, and the entry
// expires.
func (s *Service) cacheWrite(ctx context.Context, item inventory.Item, lease locking.Lease) {
	write := s.cache.Set
	if lease != nil {
		write = s.cache.Settle
	}
	if err := write(ctx, item); err != nil {
		s.log.Warn("cache write failed", "sku", item.SKU, "version", item.Version, "err", err)
	}
}

// refresh puts MySQL's stock and version in the cache after a refused or
// doubtful write: what MySQL holds now is the latest, so a newer entry
// goes (a restored database's, or a race's: a miss is always safe).
func (s *Service) refresh(ctx context.Context, sku string, lease locking.Lease) {
	item, err := s.loader(sku, lease)(ctx)
	if err == nil {
		err = s.cache.Settle(ctx, item)
	}
	if err != nil {
		s.log.Warn("cache refresh failed", "sku", sku, "err", err)
	}
}

// lost reports whether the lease can no longer be trusted.
func lost(lease locking.Lease) bool {
	if lease == nil {
		return false
	}
	select {
	case <-lease.Lost():
		return true
	default:
		return false
	}
}

// sleep waits d or until ctx is done.
