package order_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// gate is a replica's view of the stock gate, keyed as orderd keys it.
func (f *fixture) gate() *inventory.Gate {
	f.t.Helper()
	rdb, err := redisconn.Open(f.redis)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { rdb.Close() })
	return inventory.NewGate(rdb, f.prefix, f.store.DatabaseIdentity())
}

// counter is the SKU's gate counter, failing the test without one.
func (f *fixture) counter(sku string) inventory.Counter {
	f.t.Helper()
	c, ok, err := f.gate().Counter(context.WithoutCancel(f.t.Context()), sku)
	if err != nil || !ok {
		f.t.Fatalf("gate counter of %q: ok %v, %v", sku, ok, err)
	}
	return c
}

// wantSettled checks that nothing is in flight on the SKU's gate and that
// its counter is MySQL's stock.
func (f *fixture) wantSettled(sku string) {
	f.t.Helper()
	c, a := f.counter(sku), f.audit(sku)
	if c.Held != 0 || c.Stock != a.Stock {
		f.t.Fatalf("gate counter %+v, MySQL stock %d: want held 0 and the same stock", c, a.Stock)
	}
}

// queryCounter counts the MySQL calls of the flow.
type queryCounter struct {
	order.Store
	n *atomic.Int64
}

func (s queryCounter) PlaceOrder(ctx context.Context, w storage.Write, bc func() error) (storage.Inventory, error) {
	s.n.Add(1)
	return s.Store.PlaceOrder(ctx, w, bc)
}
func (s queryCounter) Order(ctx context.Context, id string) (storage.Order, error) {
	s.n.Add(1)
	return s.Store.Order(ctx, id)
}
func (s queryCounter) OrderByKey(ctx context.Context, key string) (storage.Order, error) {
	s.n.Add(1)
	return s.Store.OrderByKey(ctx, key)
}
func (s queryCounter) Inventory(ctx context.Context, sku string) (storage.Inventory, error) {
	s.n.Add(1)
	return s.Store.Inventory(ctx, sku)
}
func (s queryCounter) InventoryLatest(ctx context.Context, sku string) (storage.Inventory, error) {
	s.n.Add(1)
	return s.Store.InventoryLatest(ctx, sku)
}
func (s queryCounter) Hold(ctx context.Context, g storage.Guard, r storage.Reservation, ttl time.Duration, m []storage.Move) (storage.Reservation, []storage.Inventory, error) {
	s.n.Add(1)
	return s.Store.Hold(ctx, g, r, ttl, m)
}
func (s queryCounter) ReservationByKey(ctx context.Context, key string) (storage.Reservation, error) {
	s.n.Add(1)
	return s.Store.ReservationByKey(ctx, key)
}

// countingLocker counts acquisitions.
type countingLocker struct {
	order.Locker
	n *atomic.Int64
}

func (l countingLocker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	l.n.Add(1)
	return l.Locker.Acquire(ctx, key)
}

// A gate that says no answers 409 out_of_stock with no lock taken and no
// MySQL query, for an order and for a hold.
func TestGateRefusesWithoutLockOrMySQL(t *testing.T) {
	f := newFixture(t)
	f.stock("gate-refuse", 2)
	locker, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Close() })
	var queries, grants atomic.Int64
	svc := f.serviceWith(queryCounter{f.openStore(), &queries}, nil, countingLocker{locker, &grants},
		order.Config{Guard: storage.GuardVersion, Gate: f.gate()})
	h := svc.Handler()
	for range 2 {
		if rec := post(h, "gate-refuse", 1); rec.Code != http.StatusCreated {
			t.Fatalf("status %d body %s, want 201", rec.Code, rec.Body)
		}
	}
	queries.Store(0)
	grants.Store(0)
	wantCode(t, post(h, "gate-refuse", 1), http.StatusConflict, "out_of_stock")
	wantCode(t, hold(h, 60, "", "gate-refuse", 1), http.StatusConflict, "out_of_stock")
	if q, g := queries.Load(), grants.Load(); q != 0 || g != 0 {
		t.Fatalf("the gate's refusals made %d MySQL queries and %d lock acquisitions, want none", q, g)
	}
	f.wantSettled("gate-refuse")
}

// failingStore fails every order write: before it (nothing written) or,
// with commit, after MySQL committed it (a connection lost during COMMIT).
type failingStore struct {
	order.Store
	commit bool
}

func (s failingStore) PlaceOrder(ctx context.Context, w storage.Write, bc func() error) (storage.Inventory, error) {
	if s.commit {
		if _, err := s.Store.PlaceOrder(ctx, w, bc); err != nil {
			return storage.Inventory{}, err
		}
	}
	return storage.Inventory{}, errors.New("connection lost")
}

// Every path on which the order does not commit gives its quantity back
// to the gate, and the one where it commits but the write reported a
// failure keeps it taken.
func TestGateGivesBackOnEveryFailure(t *testing.T) {
	f := newFixture(t)
	redisLocker := func() order.Locker {
		l, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	lost := make(chan struct{})
	close(lost)
	cases := []struct {
		name      string
		store     func() order.Store
		wrap      func(order.Cache) order.Cache
		locker    func(sku string) order.Locker
		cfg       order.Config
		setup     func(sku string)
		place     func(svc *order.Service, sku string) error // nil: POST, want status and code
		status    int
		code      string
		committed bool
	}{
		{name: "lock timeout", locker: func(sku string) order.Locker {
			l := redisLocker()
			lease, err := redisLocker().Acquire(t.Context(), "sku/"+sku)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lease.Release(context.WithoutCancel(t.Context())) })
			return l
		}, cfg: order.Config{LockWait: 100 * time.Millisecond}, status: 503, code: "lock_timeout"},
		{name: "lock unavailable", locker: func(string) order.Locker { return downLocker{} }, status: 503, code: "unavailable"},
		{name: "lock lost", locker: func(string) order.Locker { return lostLocker{redisLocker(), lost} }, status: 409, code: "lock_lost"},
		{name: "version conflicts spent", wrap: func(c order.Cache) order.Cache { return staleCache{c} },
			cfg: order.Config{Guard: storage.GuardVersion}, status: 409, code: "conflict"},
		{name: "out of stock in MySQL", cfg: order.Config{Guard: storage.GuardAtomic},
			setup: func(sku string) { f.stock(sku, 0) }, status: 409, code: "out_of_stock"},
		{name: "write failed", store: func() order.Store { return failingStore{Store: f.openStore()} },
			cfg: order.Config{Guard: storage.GuardAtomic}, status: 503, code: "unavailable"},
		{name: "client gone mid-flow", cfg: order.Config{Guard: storage.GuardAtomic, WorkDelay: time.Minute},
			place: func(svc *order.Service, sku string) error {
				_, _, err := svc.Place(cancelAt(t, order.HookAfterRead), order.Request{SKU: sku, Quantity: 1})
				return err
			}},
		{name: "committed, reported failed", store: func() order.Store { return failingStore{Store: f.openStore(), commit: true} },
			cfg: order.Config{Guard: storage.GuardAtomic}, status: 201, committed: true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sku := fmt.Sprintf("gate-fail-%d", i)
			f.stock(sku, 5)
			if err := f.gate().Seed(t.Context(), sku, 5); err != nil {
				t.Fatal(err)
			}
			if c.setup != nil {
				c.setup(sku)
			}
			store := order.Store(f.openStore())
			if c.store != nil {
				store = c.store()
			}
			var locker order.Locker
			if c.locker != nil {
				locker = c.locker(sku)
			}
			cfg := c.cfg
			cfg.Gate = f.gate()
			if c.place != nil {
				cfg.Observers = faultHook(cancelHook)
			}
			svc := f.serviceWith(store, c.wrap, locker, cfg)
			if c.place != nil {
				if err := c.place(svc, sku); !errors.Is(err, context.Canceled) {
					t.Fatalf("Place: %v, want the client's cancellation", err)
				}
			} else if rec := post(svc.Handler(), sku, 1); c.status == 201 {
				if rec.Code != 201 {
					t.Fatalf("status %d body %s, want 201", rec.Code, rec.Body)
				}
			} else {
				wantCode(t, rec, c.status, c.code)
			}
			want := inventory.Counter{Stock: 5}
			if c.committed {
				want.Stock = 4
			}
			if got := f.counter(sku); got.Stock != want.Stock || got.Held != 0 {
				t.Fatalf("gate counter %+v after the failure, want stock %d, held 0", got, want.Stock)
			}
		})
	}
}

// cancelKey carries, in a request's context, the cancel the fault hook
// calls.
type cancelKey struct{}

// cancelAt returns a context that cancelHook cancels at point at: the
// client leaving at that step of the flow.
func cancelAt(t *testing.T, at order.HookPoint) context.Context {
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	return context.WithValue(ctx, cancelKey{}, func(p order.HookPoint) {
		if p == at {
			cancel()
		}
	})
}

func cancelHook(ctx context.Context, at order.HookPoint, _ order.HookInfo) {
	if f, ok := ctx.Value(cancelKey{}).(func(order.HookPoint)); ok {
		f(at)
	}
}

// A replica that dies between its take and its settle leaves the stock
// undersold until the back-check, which asks MySQL by the order's id:
// gives back the take of an order that never committed, and keeps the
// take of one that did.
func TestGateBackCheck(t *testing.T) {
	for _, c := range []struct {
		at        order.HookPoint
		committed bool
	}{{order.HookBeforeWrite, false}, {order.HookAfterCommit, true}} {
		t.Run(string(c.at), func(t *testing.T) {
			f := newFixture(t)
			sku := "gate-dies-" + string(c.at)
			f.stock(sku, 5)
			die := func(_ context.Context, at order.HookPoint, _ order.HookInfo) {
				if at == c.at {
					runtime.Goexit() // the replica dies here: nothing after runs
				}
			}
			dying := f.service(nil, order.Config{Instance: "dies", Guard: storage.GuardAtomic, Gate: f.gate(), Observers: faultHook(die)})
			done := make(chan struct{})
			go func() {
				defer close(done)
				dying.Place(t.Context(), order.Request{SKU: sku, Quantity: 2, Key: "k-" + sku})
			}()
			<-done

			sold := int64(0)
			if c.committed {
				sold = 2
			}
			if a := f.audit(sku); a.Stock != 5-sold {
				t.Fatalf("MySQL stock %d, want %d", a.Stock, 5-sold)
			}
			if got := f.counter(sku); got.Stock != 3 || got.Held != 2 {
				t.Fatalf("gate counter %+v after the death, want stock 3, held 2", got)
			}
			other := f.service(nil, order.Config{Instance: "lives", Guard: storage.GuardAtomic, Gate: f.gate()})
			if n, err := other.BackCheck(t.Context(), time.Now()); err != nil || n != 0 {
				t.Fatalf("back-check before the deadline gave back %d (%v), want none", n, err)
			}
			if got := f.counter(sku); got.Held != 2 {
				t.Fatalf("gate counter %+v: the back-check settled a take before its deadline", got)
			}
			n, err := other.BackCheck(t.Context(), time.Now().Add(order.GateBound(other)+time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{false: 1, true: 0}[c.committed]; n != want {
				t.Fatalf("back-check past the deadline gave back %d takes, want %d", n, want)
			}
			f.wantSettled(sku)
			// Again: settled once.
			if n, err := other.BackCheck(t.Context(), time.Now().Add(time.Hour)); err != nil || n != 0 {
				t.Fatalf("second back-check gave back %d (%v), want none", n, err)
			}
			f.wantSettled(sku)
		})
	}
}

// inFlightGate tells when a take found its tag in flight.
type inFlightGate struct {
	order.StockGate
	once     sync.Once
	inFlight chan struct{}
}

func (g *inFlightGate) Take(ctx context.Context, tag, entry string, deadline time.Time, key inventory.TakeKey, lines []inventory.Line) error {
	err := g.StockGate.Take(ctx, tag, entry, deadline, key, lines)
	if errors.Is(err, inventory.ErrInFlight) {
		g.once.Do(func() { close(g.inFlight) })
	}
	return err
}

// A replay takes nothing: after the first committed, and while it is in
// flight on another replica.
func TestGateReplayTakesNothing(t *testing.T) {
	f := newFixture(t)
	const sku, key = "gate-replay", "Key-a"
	f.stock(sku, 5)
	paused, resume := make(chan struct{}), make(chan struct{})
	first := f.service(nil, order.Config{Instance: "r1", Guard: storage.GuardAtomic, Gate: f.gate(),
		Observers: faultHook(func(_ context.Context, at order.HookPoint, h order.HookInfo) {
			if at == order.HookBeforeWrite && h.Key == key {
				close(paused)
				<-resume
			}
		})})
	g := &inFlightGate{StockGate: f.gate(), inFlight: make(chan struct{})}
	second := f.service(nil, order.Config{Instance: "r2", Guard: storage.GuardAtomic, Gate: g})

	var o1 order.Order
	var err1 error
	done := make(chan struct{})
	go func() {
		defer close(done)
		o1, _, err1 = first.Place(t.Context(), order.Request{SKU: sku, Quantity: 2, Key: key})
	}()
	<-paused
	var o2 order.Order
	var replayed2 bool
	var err2 error
	done2 := make(chan struct{})
	go func() {
		defer close(done2)
		o2, replayed2, err2 = second.Place(t.Context(), order.Request{SKU: sku, Quantity: 2, Key: key})
	}()
	select {
	case <-g.inFlight: // the replay found the first in flight
	case <-done2:
		close(resume)
		t.Fatalf("the replay did not wait for the first in flight (order %s, %v): it took stock of its own", o2.ID, err2)
	}
	if got := f.counter(sku); got.Stock != 3 || got.Held != 2 {
		t.Fatalf("gate counter %+v with a replay in flight, want stock 3, held 2: one take", got)
	}
	close(resume)
	<-done
	<-done2
	if err1 != nil || err2 != nil || !replayed2 || o2.ID != o1.ID {
		t.Fatalf("first %v %v, replay %v %v (replayed %v): want one order, replayed", o1.ID, err1, o2.ID, err2, replayed2)
	}
	// And after: a replay through the handler takes nothing.
	if rec := post(second.Handler(), sku, 2, "Idempotency-Key", key); rec.Code != 200 {
		t.Fatalf("replay: status %d body %s, want 200", rec.Code, rec.Body)
	}
	// A key is exact bytes: key-A is another order.
	if rec := post(second.Handler(), sku, 2, "Idempotency-Key", "key-A"); rec.Code != 201 {
		t.Fatalf("key-A: status %d body %s, want 201", rec.Code, rec.Body)
	}
	if a := f.audit(sku); a.Orders != 2 {
		t.Fatalf("%d orders, want 2", a.Orders)
	}
	f.wantSettled(sku)
}

// Replicas selling one SKU at once, with real contention, never admit
// more than its stock, and leave the gate's counter equal to MySQL's.
func TestGateConcurrentNeverOversells(t *testing.T) {
	for _, c := range []struct {
		lock  string
		guard storage.Guard
	}{{"none", storage.GuardAtomic}, {"redis", storage.GuardVersion}, {"none", storage.GuardNone}} {
		t.Run(c.lock+"/"+string(c.guard), func(t *testing.T) {
			f := newFixture(t)
			const sku, stock, buyers = "gate-hot", 10, 40
			f.stock(sku, stock)
			var hs []http.Handler
			for i := range 3 {
				var locker order.Locker
				if c.lock == "redis" {
					l, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { l.Close() })
					locker = l
				}
				svc := f.service(locker, order.Config{Instance: fmt.Sprintf("r%d", i), Guard: c.guard, Gate: f.gate()})
				hs = append(hs, svc.Handler())
			}
			start := make(chan struct{})
			var wg sync.WaitGroup
			var sold, refused atomic.Int64
			for i := range buyers {
				wg.Go(func() {
					<-start
					rec := post(hs[i%len(hs)], sku, 1)
					switch {
					case rec.Code == 201:
						sold.Add(1)
					case rec.Code == 409 && errorCode(t, rec) == "out_of_stock":
						refused.Add(1)
					default:
						t.Errorf("status %d body %s", rec.Code, rec.Body)
					}
				})
			}
			close(start)
			wg.Wait()
			a := f.audit(sku)
			if sold.Load() != stock || a.Orders != stock {
				t.Fatalf("sold %d, %d orders in MySQL: want %d", sold.Load(), a.Orders, stock)
			}
			// Under guard none too: behind the gate MySQL is decremented
			// without a condition, so no update is lost.
			f.wantSettled(sku)
		})
	}
}

// Holds take from the gate as orders do; a cancel and an expiry give the
// lines back, and a PUT resets the counter.
func TestGateHolds(t *testing.T) {
	f := newFixture(t)
	const a, b = "gate-hold-a", "gate-hold-b"
	f.stock(a, 3)
	f.stock(b, 1)
	svc := f.service(nil, order.Config{Guard: storage.GuardAtomic, Gate: f.gate(), AdminToken: adminToken})
	h := svc.Handler()
	r := decodeReservation(t, hold(h, 60, "", a, 2, b, 1))
	if ca, cb := f.counter(a), f.counter(b); ca.Stock != 1 || cb.Stock != 0 || ca.Held != 0 || cb.Held != 0 {
		t.Fatalf("after the hold: counters %+v %+v, want stock 1 and 0, nothing in flight", ca, cb)
	}
	// All or nothing: b is short, so a keeps its 1.
	wantCode(t, hold(h, 60, "", a, 1, b, 1), 409, "out_of_stock")
	if ca := f.counter(a); ca.Stock != 1 {
		t.Fatalf("a refused hold took from a: %+v", ca)
	}
	if rec := settle(h, r.ID, "cancel"); rec.Code != 200 {
		t.Fatalf("cancel: status %d body %s", rec.Code, rec.Body)
	}
	f.wantSettled(a)
	f.wantSettled(b)

	short := decodeReservation(t, hold(h, 1, "", a, 3))
	if ca := f.counter(a); ca.Stock != 0 {
		t.Fatalf("after the hold of 3: %+v", ca)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		n, err := svc.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if err := ctx.Err(); err != nil {
			t.Fatalf("hold %s never expired", short.ID)
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.wantSettled(a)

	rec := call(h, http.MethodPut, "/v1/inventory/"+a, `{"stock": 7}`, "Authorization", "Bearer "+adminToken)
	if rec.Code != 200 {
		t.Fatalf("PUT: status %d body %s", rec.Code, rec.Body)
	}
	if ca := f.counter(a); ca.Stock != 7 {
		t.Fatalf("after PUT 7: %+v", ca)
	}
}

// The reconciler sets a counter with nothing in flight to MySQL's stock
// (stock added outside PUT, a give-back lost with its replica), and leaves
// alone a counter with a take in flight, one that changed since it was
// read, and every counter under guard none, whose MySQL stock is not the
// truth.
func TestGateReconcile(t *testing.T) {
	f := newFixture(t)
	g := f.gate()
	ctx := t.Context()
	svc := f.service(nil, order.Config{Guard: storage.GuardAtomic, Gate: g})
	trusting := f.service(nil, order.Config{Guard: storage.GuardNone, Gate: g})

	f.stock("gate-rec", 5)
	if err := g.Seed(ctx, "gate-rec", 5); err != nil {
		t.Fatal(err)
	}
	f.stock("gate-rec", 8) // outside PUT
	if err := trusting.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if c := f.counter("gate-rec"); c.Stock != 5 {
		t.Fatalf("guard none reconciled: %+v", c)
	}
	// A take in flight: left alone.
	lines := []inventory.Line{{SKU: "gate-rec", Quantity: 1}}
	if err := g.Take(ctx, "order:id:x", "{}", time.Now().Add(time.Hour), inventory.TakeKey{}, lines); err != nil {
		t.Fatal(err)
	}
	if err := svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if c := f.counter("gate-rec"); c.Stock != 4 || c.Held != 1 {
		t.Fatalf("reconciled with a take in flight: %+v", c)
	}
	if _, err := g.GiveBack(ctx, "order:id:x", lines); err != nil {
		t.Fatal(err)
	}
	// Changed since read: refused.
	c := f.counter("gate-rec")
	if ok, err := g.Reconcile(ctx, "gate-rec", 8, c.Seq-1); err != nil || ok {
		t.Fatalf("reconcile on a stale seq: %v %v, want refused", ok, err)
	}
	if err := svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	f.wantSettled("gate-rec")
}
