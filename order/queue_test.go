package order_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// queueReplica is one started replica with the gate and accept queue;
// locker nil means lock=none.
func (f *fixture) queueReplica(locker order.Locker, cfg order.Config) *order.Service {
	f.t.Helper()
	g := f.gate()
	cfg.Gate, cfg.Queue = g, g.Queue()
	s := f.service(locker, cfg)
	if err := s.Start(f.t.Context()); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { s.Close() })
	return s
}

// settledWithin polls GET /v1/orders/{id} until the order is no longer
// pending, and returns it; an order still pending after bound fails the
// test (the bound is the consumer's, far above what it takes).
func settledWithin(t *testing.T, h http.Handler, id string, bound time.Duration) order.Order {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		rec := call(h, http.MethodGet, "/v1/orders/"+id, "")
		if rec.Code != http.StatusOK {
			t.Fatalf("GET order %s: %d %s", id, rec.Code, rec.Body)
		}
		o := decodeOrder(t, rec)
		if o.Status != order.StatusPending {
			return o
		}
		if time.Now().After(deadline) {
			t.Fatalf("order %s still pending after %v", id, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// queueLen is the number of entries in the stream.
func (f *fixture) queueLen() int64 {
	f.t.Helper()
	n, err := f.gate().Queue().Len(context.WithoutCancel(f.t.Context()))
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// TestQueueAcceptsThenConfirms: an order is answered 202 pending, then
// shown confirmed once the consumer wrote it; MySQL holds it once, the gate
// has nothing in flight and the stream is empty (acknowledged and deleted).
func TestQueueAcceptsThenConfirms(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("q-confirm", 5)
	h := f.queueReplica(nil, order.Config{Guard: storage.GuardAtomic}).Handler()
	rec := post(h, "q-confirm", 2, "Idempotency-Key", "qc-1")
	if rec.Code != http.StatusAccepted {
		t.Fatalf("status %d body %s, want 202", rec.Code, rec.Body)
	}
	o := decodeOrder(t, rec)
	if o.Status != "pending" || o.ID == "" || o.Quantity != 2 {
		t.Fatalf("accepted %+v, want pending with an id", o)
	}
	got := settledWithin(t, h, o.ID, 10*time.Second)
	if got.Status != "confirmed" || got.Reason != "" || !got.CreatedAt.Equal(o.CreatedAt) {
		t.Fatalf("settled %+v, want confirmed, created when accepted (%v)", got, o.CreatedAt)
	}
	if a := f.audit("q-confirm"); a.Stock != 3 || a.Orders != 1 || a.Ordered != 2 {
		t.Fatalf("audit %+v, want stock 3 and one order of 2", a)
	}
	f.wantSettled("q-confirm")
	if n := f.queueLen(); n != 0 {
		t.Errorf("stream holds %d entries after the confirm, want 0", n)
	}
	// A replay now finds the confirmed order in MySQL.
	if rec := post(h, "q-confirm", 2, "Idempotency-Key", "qc-1"); rec.Code != http.StatusOK || decodeOrder(t, rec).Status != "confirmed" {
		t.Fatalf("replay after the confirm: %d %s, want 200 confirmed", rec.Code, rec.Body)
	}
}

// TestQueueOutOfStockAtTheGate: an order the gate cannot cover is 409
// out_of_stock at once, and nothing is appended to the stream.
func TestQueueOutOfStockAtTheGate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("q-short", 1)
	h := f.queueReplica(nil, order.Config{Guard: storage.GuardAtomic}).Handler()
	wantCode(t, post(h, "q-short", 2), http.StatusConflict, "out_of_stock")
	if n := f.queueLen(); n != 0 {
		t.Fatalf("stream holds %d entries after a refusal, want 0", n)
	}
	if c := f.counter("q-short"); c.Stock != 1 || c.Held != 0 {
		t.Fatalf("gate counter %+v after a refusal, want stock 1, held 0", c)
	}
	wantCode(t, post(h, "q-none", 1), http.StatusNotFound, "unknown_sku")
}

// TestQueueReplay: an Idempotency-Key replayed while its order is pending
// returns that order (no second take), once confirmed returns it
// confirmed, and with another body is 422 and changes nothing.
func TestQueueReplay(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("q-replay", 10)
	// No consumer yet: a queue replica that is not started.
	g := f.gate()
	idle := f.service(nil, order.Config{Guard: storage.GuardAtomic, Gate: g, Queue: g.Queue()}).Handler()
	first := post(idle, "q-replay", 3, "Idempotency-Key", "qr")
	if first.Code != http.StatusAccepted {
		t.Fatalf("status %d body %s, want 202", first.Code, first.Body)
	}
	id := decodeOrder(t, first).ID
	again := post(idle, "q-replay", 3, "Idempotency-Key", "qr")
	if o := decodeOrder(t, again); again.Code != http.StatusOK || o.ID != id || o.Status != "pending" {
		t.Fatalf("replay while pending: %d %s, want 200 pending %s", again.Code, again.Body, id)
	}
	wantCode(t, post(idle, "q-replay", 4, "Idempotency-Key", "qr"), http.StatusUnprocessableEntity, "idempotency_key_reused")
	if c := f.counter("q-replay"); c.Stock != 7 || c.Held != 3 {
		t.Fatalf("gate counter %+v, want one take of 3", c)
	}
	h := f.queueReplica(nil, order.Config{Instance: "r2", Guard: storage.GuardAtomic}).Handler()
	if o := settledWithin(t, h, id, 10*time.Second); o.Status != "confirmed" {
		t.Fatalf("settled %+v, want confirmed", o)
	}
	for _, hh := range []http.Handler{idle, h} {
		rec := post(hh, "q-replay", 3, "Idempotency-Key", "qr")
		if o := decodeOrder(t, rec); rec.Code != http.StatusOK || o.ID != id || o.Status != "confirmed" {
			t.Fatalf("replay once confirmed: %d %s, want 200 confirmed %s", rec.Code, rec.Body, id)
		}
		wantCode(t, post(hh, "q-replay", 4, "Idempotency-Key", "qr"), http.StatusUnprocessableEntity, "idempotency_key_reused")
	}
	if a := f.audit("q-replay"); a.Stock != 7 || a.Orders != 1 {
		t.Fatalf("audit %+v, want one order of 3", a)
	}
	f.wantSettled("q-replay")
}

// TestQueueConcurrentReplicas: orders released at once on three replicas,
// under a redis lock with the version guard and under no lock with the
// atomic guard, never oversell the gate or MySQL, and every accepted order
// ends confirmed; the rest are refused at the gate; the stream ends empty.
func TestQueueConcurrentReplicas(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		guard storage.Guard
		lock  bool
	}{{"redis-version", storage.GuardVersion, true}, {"none-atomic", storage.GuardAtomic, false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			var hs []http.Handler
			for i := range 3 {
				cfg := order.Config{Instance: fmt.Sprintf("r%d", i+1), Guard: c.guard, LockWait: time.Minute}
				var locker order.Locker
				if c.lock {
					locker, cfg.Lock = f.redisLocker(), "redis"
				}
				hs = append(hs, f.queueReplica(locker, cfg).Handler())
			}
			raceQueue(t, f, hs)
		})
	}
}

func raceQueue(t *testing.T, f *fixture, hs []http.Handler) {
	const stock, clients = 40, 120
	f.stock("q-race", stock)
	start := make(chan struct{})
	var mu sync.Mutex
	var accepted []string
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			<-start
			rec := post(hs[i%3], "q-race", 1, "Idempotency-Key", fmt.Sprint("race-", i))
			mu.Lock()
			defer mu.Unlock()
			codes[rec.Code]++
			if rec.Code == http.StatusAccepted {
				accepted = append(accepted, decodeOrder(t, rec).ID)
			}
		})
	}
	close(start)
	wg.Wait()
	if codes[http.StatusAccepted] != stock || codes[http.StatusConflict] != clients-stock {
		t.Fatalf("answers %v, want %d 202 and %d 409", codes, stock, clients-stock)
	}
	for i, id := range accepted {
		if o := settledWithin(t, hs[i%3], id, 30*time.Second); o.Status != "confirmed" {
			t.Fatalf("order %s %+v, want confirmed", id, o)
		}
	}
	if a := f.audit("q-race"); a.Stock != 0 || a.Orders != stock || a.Ordered != stock || a.DuplicateKeys != 0 {
		t.Fatalf("audit %+v, want every unit sold once", a)
	}
	f.wantSettled("q-race")
	if n := f.queueLen(); n != 0 {
		t.Errorf("stream holds %d entries once every order settled, want 0", n)
	}
}

// deadConsumer reads entries as a consumer of the group and never settles
// them: a replica that died after its read.
func (f *fixture) deadConsumer(n int) []inventory.Delivery {
	f.t.Helper()
	ds, err := f.gate().Queue().Read(f.t.Context(), "dead", n, time.Second)
	if err != nil {
		f.t.Fatal(err)
	}
	return ds
}

// TestQueueDeadConsumerClaimed: entries a consumer read and never settled
// (it died after its read) are claimed by a live replica once idle past
// the claim bound, and confirmed once each.
func TestQueueDeadConsumerClaimed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("q-dead", 10)
	g := f.gate()
	// A replica that accepts and does not consume (not started).
	front := f.service(nil, order.Config{Guard: storage.GuardAtomic, Gate: g, Queue: g.Queue()}).Handler()
	if err := g.Queue().Group(t.Context()); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 4 {
		rec := post(front, "q-dead", 1, "Idempotency-Key", fmt.Sprint("dead-", i))
		if rec.Code != http.StatusAccepted {
			t.Fatalf("status %d body %s, want 202", rec.Code, rec.Body)
		}
		ids = append(ids, decodeOrder(t, rec).ID)
	}
	if ds := f.deadConsumer(10); len(ds) != 4 {
		t.Fatalf("the dead consumer read %d entries, want 4", len(ds))
	}
	h := f.queueReplica(nil, order.Config{Instance: "live", Guard: storage.GuardAtomic, ClaimIdle: time.Second}).Handler()
	for _, id := range ids {
		if o := settledWithin(t, h, id, 15*time.Second); o.Status != "confirmed" {
			t.Fatalf("order %s %+v, want confirmed", id, o)
		}
	}
	if a := f.audit("q-dead"); a.Stock != 6 || a.Orders != 4 || a.DuplicateKeys != 0 {
		t.Fatalf("audit %+v, want 4 orders of 1", a)
	}
	f.wantSettled("q-dead")
	if n := f.queueLen(); n != 0 {
		t.Errorf("stream holds %d entries, want 0", n)
	}
}

// unsettledQueue is a consumer that dies between its commit and its
// settle: every Settle fails, so its entries stay pending.
type unsettledQueue struct {
	order.OrderQueue
	tried chan struct{}
	once  *sync.Once
}

func (q unsettledQueue) Settle(ctx context.Context, sku string, settled []inventory.Settled, keep time.Duration) error {
	q.once.Do(func() { close(q.tried) })
	return fmt.Errorf("died before the settle")
}

// TestQueueRedeliveryWritesOnce: a consumer commits a batch and dies
// before acknowledging it; another replica claims the entries and, finding
// their outcome in MySQL, settles them without writing them again.
func TestQueueRedeliveryWritesOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("q-redo", 10)
	g := f.gate()
	tried := make(chan struct{})
	dying := f.service(nil, order.Config{Instance: "dying", Guard: storage.GuardAtomic, Gate: g,
		Queue: unsettledQueue{g.Queue(), tried, &sync.Once{}}, ClaimIdle: time.Hour})
	if err := dying.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 3 {
		var key []string // with a key and without: either is written once
		if i%2 == 0 {
			key = []string{"Idempotency-Key", fmt.Sprint("redo-", i)}
		}
		rec := post(dying.Handler(), "q-redo", 2, key...)
		if rec.Code != http.StatusAccepted {
			t.Fatalf("status %d body %s, want 202", rec.Code, rec.Body)
		}
		ids = append(ids, decodeOrder(t, rec).ID)
	}
	<-tried
	dying.Close() // dead: its entries stay pending to it
	if a := f.audit("q-redo"); a.Orders == 0 {
		t.Fatalf("audit %+v: the dying consumer wrote nothing", a)
	}
	h := f.queueReplica(nil, order.Config{Instance: "heir", Guard: storage.GuardAtomic, ClaimIdle: time.Second}).Handler()
	for _, id := range ids {
		if o := settledWithin(t, h, id, 15*time.Second); o.Status != "confirmed" {
			t.Fatalf("order %s %+v, want confirmed", id, o)
		}
	}
	if a := f.audit("q-redo"); a.Stock != 4 || a.Orders != 3 || a.Ordered != 6 {
		t.Fatalf("audit %+v, want 3 orders of 2, each written once", a)
	}
	f.wantSettled("q-redo")
}

// TestQueueRejected: an order MySQL cannot cover once written (its stock
// was cut after the accept) is rejected with its reason, shown so by GET
// and by a replay, and its quantity goes back to the gate.
func TestQueueRejected(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("q-rej", 5)
	g := f.gate()
	front := f.service(nil, order.Config{Guard: storage.GuardAtomic, Gate: g, Queue: g.Queue()}).Handler()
	rec := post(front, "q-rej", 3, "Idempotency-Key", "rej")
	if rec.Code != http.StatusAccepted {
		t.Fatalf("status %d body %s, want 202", rec.Code, rec.Body)
	}
	id := decodeOrder(t, rec).ID
	f.stock("q-rej", 1) // MySQL only, behind the gate's back
	h := f.queueReplica(nil, order.Config{Instance: "r2", Guard: storage.GuardAtomic}).Handler()
	o := settledWithin(t, h, id, 10*time.Second)
	if o.Status != "rejected" || o.Reason != "out_of_stock" || o.Quantity != 3 {
		t.Fatalf("settled %+v, want rejected, reason out_of_stock", o)
	}
	replay := post(front, "q-rej", 3, "Idempotency-Key", "rej")
	if got := decodeOrder(t, replay); replay.Code != http.StatusOK || got.ID != id || got.Status != "rejected" {
		t.Fatalf("replay: %d %s, want 200 rejected %s", replay.Code, replay.Body, id)
	}
	if c := f.counter("q-rej"); c.Stock != 5 || c.Held != 0 {
		t.Fatalf("gate counter %+v, want the 3 given back (stock 5, held 0)", c)
	}
	if a := f.audit("q-rej"); a.Stock != 1 || a.Orders != 0 {
		t.Fatalf("audit %+v, want nothing written", a)
	}
}

// TestBatchWork: a batch's business logic (OVERSOLD_WORK_DELAY per order)
// takes n work delays inside a lock's critical section, where its orders
// wait for each other, and one without a lock, where nothing makes them
// (a queued batch under lock none): a lock-free consumer is not slowed by
// a wait no lock asks for.
func TestBatchWork(t *testing.T) {
	const d = 2 * time.Millisecond
	s := order.New(nil, nil, nil, order.Config{WorkDelay: d})
	for _, c := range []struct {
		locked bool
		n      int
		want   time.Duration
	}{{true, 1, d}, {true, 64, 64 * d}, {false, 1, d}, {false, 64, d}} {
		if got := order.Work(s, c.locked, c.n); got != c.want {
			t.Errorf("work of %d orders, locked %v: %v, want %v", c.n, c.locked, got, c.want)
		}
	}
}
