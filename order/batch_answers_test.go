package order_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// scriptedStore runs the n-th write (from 1) through step(n, ...); the
// real store does whatever step does not replace.
type scriptedStore struct {
	order.Store
	mu     sync.Mutex
	writes int
	step   func(n int, ctx context.Context, w storage.Write, real func() (storage.Inventory, error)) (storage.Inventory, error)
}

func (s *scriptedStore) PlaceOrder(ctx context.Context, w storage.Write, beforeCommit func() error) (storage.Inventory, error) {
	s.mu.Lock()
	s.writes++
	n := s.writes
	s.mu.Unlock()
	return s.step(n, ctx, w, func() (storage.Inventory, error) { return s.Store.PlaceOrder(ctx, w, beforeCommit) })
}

func (s *scriptedStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}

// redisLocker is a locker of the test's own, with a TTL longer than any
// write the test stalls.
func (f *fixture) redisLocker() order.Locker {
	f.t.Helper()
	l, err := backends.Open(f.t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 30 * time.Second})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { l.Close() })
	return l
}

// placeElsewhere commits one order of 1 under key, as another replica would.
func (f *fixture) placeElsewhere(sku, key, id string) {
	f.t.Helper()
	o := storage.Order{ID: id, SKU: sku, Quantity: 1, Status: storage.StatusConfirmed,
		Instance: "elsewhere", Lock: "redis", IdempotencyKey: &key, Fingerprint: storage.OrderFingerprint(sku, 1),
		CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	if _, err := f.store.PlaceOrder(context.WithoutCancel(f.t.Context()), storage.Write{Guard: storage.GuardAtomic, Orders: []storage.Order{o}}, nil); err != nil {
		f.t.Fatal(err)
	}
}

// TestRetryForgetsTheTryBefore: under the atomic guard, a batch of five
// orders of one on a cached stock of 10 (MySQL has 3) is refused as a sum
// and sold again on MySQL's stock: three fill, two are short. That second
// write meets a key taken meanwhile by another replica (zz-0, a replay),
// and the rest sell a third time, whose write is refused for a lost lock.
// Nothing of the batch was written: the short orders share that answer,
// lock_lost, and not the out_of_stock of the first refusal, whose stock
// is still there.
func TestRetryForgetsTheTryBefore(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const sku = "zz-hot"
	f.stock(sku, 10)
	inv, err := f.store.Inventory(t.Context(), sku)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cache().Force(t.Context(), inventory.Item{SKU: inv.SKU, Stock: inv.Stock, Version: inv.Version}); err != nil {
		t.Fatal(err)
	}
	f.stock(sku, 3) // sold elsewhere: the cache still says 10
	const elsewhere = "0190a5c8-0000-7000-8000-0000000000f0"
	store := &scriptedStore{Store: f.openStore(), step: func(n int, ctx context.Context, w storage.Write, real func() (storage.Inventory, error)) (storage.Inventory, error) {
		switch n {
		case 2: // another replica commits zz-0 first: the real write fails on its key
			f.placeElsewhere(sku, "zz-0", elsewhere)
		case 3: // the fence moved on
			return storage.Inventory{}, storage.ErrStaleFence
		}
		return real()
	}}
	s := f.serviceWith(store, nil, f.redisLocker(), order.Config{Lock: "redis", Guard: storage.GuardAtomic, LockWait: time.Minute})
	keys := []string{"zz-0", "zz-1", "zz-2", "zz-3", "zz-4"}
	recs := f.queued(s, sku, keys, func(int) int { return 1 })

	if r := recs[0]; r.Code != http.StatusOK || decodeOrder(t, r).ID != elsewhere {
		t.Errorf("zz-0, taken elsewhere: %d %s, want 200 with that order", r.Code, r.Body)
	}
	for i, r := range recs[1:] {
		if r.Code != http.StatusConflict || errorCode(t, r) != "lock_lost" {
			t.Errorf("%s: %d %s, want 409 lock_lost: the batch wrote nothing", keys[i+1], r.Code, r.Body)
		}
	}
	if n := store.count(); n != 3 {
		t.Errorf("%d writes, want 3", n)
	}
	if a := f.audit(sku); a.Orders != 1 || a.Stock != 2 {
		t.Errorf("audit %+v, want only the order placed elsewhere, stock 2", a)
	}
}

// TestDoubtfulWriteAnswersEveryOrder: a batch of three orders of one with
// two in stock whose write commits but reports a lost connection. MySQL
// settles it: the two filled orders are 201, and the third is out_of_stock,
// the stock it lacked being committed. No order is answered as a sale
// without one.
func TestDoubtfulWriteAnswersEveryOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const sku = "dw-hot"
	f.stock(sku, 2)
	store := &scriptedStore{Store: f.openStore(), step: func(n int, ctx context.Context, w storage.Write, real func() (storage.Inventory, error)) (storage.Inventory, error) {
		inv, err := real()
		if n == 1 && err == nil {
			return storage.Inventory{}, errors.New("invalid connection") // the reply to COMMIT lost
		}
		return inv, err
	}}
	s := f.serviceWith(store, nil, f.redisLocker(), order.Config{Lock: "redis", Guard: storage.GuardVersion, LockWait: time.Minute})
	recs := f.queued(s, sku, []string{"dw-0", "dw-1", "dw-2"}, func(int) int { return 1 })
	for i, r := range recs[:2] {
		if r.Code != http.StatusCreated || decodeOrder(t, r).ID == "" {
			t.Errorf("order %d: %d %s, want 201 with its order", i, r.Code, r.Body)
		}
	}
	if r := recs[2]; r.Code != http.StatusConflict || errorCode(t, r) != "out_of_stock" {
		t.Errorf("order 2: %d %s, want 409 out_of_stock", r.Code, r.Body)
	}
	if a := f.audit(sku); a.Orders != 2 || a.Stock != 0 {
		t.Errorf("audit %+v, want 2 orders, stock 0", a)
	}
}

// TestConflictRefreshOutlivesTheWrite: a version-guarded write refused as
// its own time runs out (a restock landed while it waited) still puts
// MySQL's stock in the cache, on a context of its own: the retry then
// reads the restock and commits at once, where a refresh on the write's
// spent context failed and the retry met the same stale entry again.
func TestConflictRefreshOutlivesTheWrite(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const sku = "cr-hot"
	f.stock(sku, 5)
	store := &scriptedStore{Store: f.openStore(), step: func(n int, ctx context.Context, w storage.Write, real func() (storage.Inventory, error)) (storage.Inventory, error) {
		if n == 1 {
			f.stock(sku, 7) // a restock: the version moves on
			<-ctx.Done()    // the write's whole bound
			return storage.Inventory{}, storage.ErrConflict
		}
		return real()
	}}
	s := f.serviceWith(store, nil, f.redisLocker(), order.Config{Lock: "redis", Guard: storage.GuardVersion,
		LockWait: time.Minute, RequestTimeout: time.Minute})
	if r := post(s.Handler(), sku, 1, "Idempotency-Key", "cr-0"); r.Code != http.StatusCreated {
		t.Fatalf("order: %d %s, want 201", r.Code, r.Body)
	}
	if n := store.count(); n != 2 {
		t.Errorf("%d writes, want 2: the retry after the refusal read a stale cache", n)
	}
	if a := f.audit(sku); a.Orders != 1 || a.Stock != 6 {
		t.Errorf("audit %+v, want 1 order, stock 6", a)
	}
}

// TestQueuedOrderLeavesOnItsDeadline: an order that queues while the lock
// is held elsewhere, past its OVERSOLD_REQUEST_TIMEOUT, is answered then,
// 503, while the lock is still held, and leaves the queue: nothing of it
// is written, and sent again it is sold.
func TestQueuedOrderLeavesOnItsDeadline(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const sku = "ld"
	f.stock(sku, 10)
	s := f.service(f.redisLocker(), order.Config{Lock: "redis", Guard: storage.GuardVersion,
		LockWait: time.Minute, RequestTimeout: 500 * time.Millisecond})
	lease := f.holdLock(sku)
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() { answered <- post(s.Handler(), sku, 1, "Idempotency-Key", "ld-0") }()
	var r *httptest.ResponseRecorder
	select {
	case r = <-answered:
	case <-time.After(30 * time.Second):
		t.Fatal("the order was not answered on its deadline while the lock was held")
	}
	if n := order.Queued(s, sku); n != 0 {
		t.Errorf("%d orders queued after the only one's deadline, want 0", n)
	}
	if r.Code != http.StatusServiceUnavailable || !strings.Contains(r.Body.String(), "ran out of time") {
		t.Errorf("the order past its deadline: %d %s, want 503, out of time", r.Code, r.Body)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); order.Draining(s, sku); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the SKU's drain still runs after 30s")
		}
	}
	if _, err := f.store.OrderByKey(t.Context(), "ld-0"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("the order that left: %v, want not in MySQL", err)
	}
	if again := post(s.Handler(), sku, 1, "Idempotency-Key", "ld-0"); again.Code != http.StatusCreated {
		t.Errorf("sent again: %d %s, want 201", again.Code, again.Body)
	}
	if a := f.audit(sku); a.Orders != 1 || a.Stock != 9 {
		t.Errorf("audit %+v, want the one order sent again", a)
	}
}
