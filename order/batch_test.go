package order_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// holdLock takes sku's redis lock from a locker of its own, as another
// replica would; the locker closes with the test.
func (f *fixture) holdLock(sku string) locking.Lease {
	f.t.Helper()
	other, err := backends.Open(f.t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { other.Close() })
	lease, err := other.Acquire(f.t.Context(), "sku/"+sku)
	if err != nil {
		f.t.Fatal(err)
	}
	return lease
}

// queued sends one order per key, in that order, while the SKU's lock is
// held by another locker, so they all queue in one replica; once the last
// has queued the lock is released. It returns the answers, by key index.
func (f *fixture) queued(s *order.Service, sku string, keys []string, qty func(i int) int) []*httptest.ResponseRecorder {
	f.t.Helper()
	lease := f.holdLock(sku)
	recs := make([]*httptest.ResponseRecorder, len(keys))
	wait := f.inOrder(s, sku, len(keys), func(i int) {
		recs[i] = post(s.Handler(), sku, qty(i), "Idempotency-Key", keys[i])
	})
	if err := lease.Release(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	wait()
	return recs
}

// inOrder runs send(i) for i from 0 to n-1, each on its own goroutine,
// starting the next only once the one before has queued on s for sku (a
// fixed pause between them lost the order on a loaded machine). It
// returns once all n are queued; wait waits for the sends to finish.
func (f *fixture) inOrder(s *order.Service, sku string, n int, send func(i int)) (wait func()) {
	f.t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { send(i) })
		deadline := time.Now().Add(30 * time.Second)
		for order.Queued(s, sku) <= i {
			if time.Now().After(deadline) {
				f.t.Fatalf("order %d of %d never queued for %s", i, n, sku)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return wg.Wait
}

// TestCoalescing: 30 orders that queue behind a held lock are sold in one
// batch (one lease: one token on every order), filled in arrival order while
// the stock lasts, a smaller order after a refused one still filled, the
// rest 409; MySQL holds exactly what was acknowledged.
func TestCoalescing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("co-hot", 12)
	s := f.redisReplica(order.Config{Guard: storage.GuardVersion})
	keys := make([]string, 30)
	for i := range keys {
		keys[i] = fmt.Sprintf("co-%02d", i)
	}
	// Order 5 asks for 5, order 6 for 3, the others for 1: 0-4 take 5,
	// 5 takes 5 (2 left), 6 does not fit, 7 and 8 take the last 2.
	qty := func(i int) int {
		switch i {
		case 5:
			return 5
		case 6:
			return 3
		}
		return 1
	}
	recs := f.queued(s, "co-hot", keys, qty)
	tokens := map[uint64]int{}
	for i, r := range recs {
		want := http.StatusConflict
		if i <= 5 || i == 7 || i == 8 {
			want = http.StatusCreated
		}
		if r.Code != want {
			t.Errorf("order %d (%d): %d %s, want %d", i, qty(i), r.Code, r.Body, want)
		}
		if r.Code == http.StatusCreated {
			tokens[decodeOrder(t, r).Token]++
		}
	}
	if len(tokens) != 1 {
		t.Errorf("tokens of the sold orders: %v, want one lease for the whole batch", tokens)
	}
	if a := f.audit("co-hot"); a.Stock != 0 || a.Ordered != 12 || a.Orders != 8 {
		t.Errorf("audit %+v, want 8 orders of 12 in all, stock 0", a)
	}
}

// TestBatchKeys: inside a batch, a key sent twice is one order (the second
// a replay, or 422 with another body), and a key taken by a concurrent
// writer fails alone: the rest of the batch is sold.
func TestBatchKeys(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("bk", 100)
	s := f.redisReplica(order.Config{Guard: storage.GuardNone})

	// A writer elsewhere takes key bk-2 while the batch waits for the lock.
	lease := f.holdLock("bk")
	keys := []string{"bk-1", "bk-2", "bk-1", "bk-3", "bk-1"}
	qty := []int{1, 1, 1, 1, 2} // the last one reuses bk-1 with another body
	recs := make([]*httptest.ResponseRecorder, len(keys))
	wait := f.inOrder(s, "bk", len(keys), func(i int) {
		recs[i] = post(s.Handler(), "bk", qty[i], "Idempotency-Key", keys[i])
	})
	key := "bk-2"
	elsewhere := storage.Order{ID: "0190a5c8-0000-7000-8000-00000000bb02", SKU: "bk", Quantity: 1, Status: storage.StatusConfirmed,
		Instance: "elsewhere", Lock: "redis", IdempotencyKey: &key, Fingerprint: storage.OrderFingerprint("bk", 1),
		CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	if _, err := f.store.PlaceOrder(t.Context(), storage.Write{Guard: storage.GuardAtomic, Orders: []storage.Order{elsewhere}}, nil); err != nil {
		t.Fatal(err)
	}
	lease.Release(context.Background())
	wait()

	first := decodeOrder(t, recs[0])
	if recs[0].Code != http.StatusCreated || recs[3].Code != http.StatusCreated {
		t.Errorf("bk-1 %d, bk-3 %d: want both sold", recs[0].Code, recs[3].Code)
	}
	if r := recs[1]; r.Code != http.StatusOK || decodeOrder(t, r).ID != elsewhere.ID {
		t.Errorf("bk-2, taken elsewhere: %d %s, want 200 with that order", r.Code, r.Body)
	}
	if r := recs[2]; r.Code != http.StatusOK || decodeOrder(t, r).ID != first.ID {
		t.Errorf("bk-1 again: %d %s, want 200 with the first order", r.Code, r.Body)
	}
	if r := recs[4]; r.Code != http.StatusUnprocessableEntity {
		t.Errorf("bk-1 with another quantity: %d %s, want 422", r.Code, r.Body)
	}
	if a := f.audit("bk"); a.Orders != 3 || a.Stock != 97 {
		t.Errorf("audit %+v, want 3 orders (bk-1, bk-2, bk-3), stock 97", a)
	}
}

// conflictOnce refuses the first write as the version guard would after a
// concurrent restock: it sets the SKU's stock to restock first.
type conflictOnce struct {
	order.Store
	once    sync.Once
	restock func()
}

func (s *conflictOnce) PlaceOrder(ctx context.Context, w storage.Write, beforeCommit func() error) (storage.Inventory, error) {
	refused := false
	s.once.Do(func() { s.restock(); refused = true })
	if refused {
		return storage.Inventory{}, storage.ErrConflict
	}
	return s.Store.PlaceOrder(ctx, w, beforeCommit)
}

// TestShortOrdersShareTheBatchFate: a batch whose write is refused does
// not answer out_of_stock to the orders it left out for want of stock: the
// stock they lacked was never taken. They are retried with the rest, and
// sold when the retry finds stock (a restock came in between).
func TestShortOrdersShareTheBatchFate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("sf-batch", 1)
	store := &conflictOnce{Store: f.openStore(), restock: func() { f.stock("sf-batch", 5) }}
	locker, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	s := f.serviceWith(store, nil, locker, order.Config{Lock: "redis", Guard: storage.GuardVersion, LockWait: time.Minute})
	recs := f.queued(s, "sf-batch", []string{"sf-1", "sf-2", "sf-3"}, func(int) int { return 1 })
	for i, r := range recs {
		if r.Code != http.StatusCreated {
			t.Errorf("order %d: %d %s, want 201: the restock left enough for all three", i, r.Code, r.Body)
		}
	}
	if a := f.audit("sf-batch"); a.Orders != 3 || a.Stock != 2 {
		t.Errorf("audit %+v, want 3 orders and stock 2", a)
	}
}

// TestAtomicBatchOnStaleCache: under the atomic guard a batch's one
// conditional write asks for its sum. When the cache is behind MySQL the
// sum is refused, yet some orders fit: they are sold, in arrival order, on
// MySQL's stock, and only the rest are 409.
func TestAtomicBatchOnStaleCache(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("ab-hot", 10)
	inv, err := f.store.Inventory(t.Context(), "ab-hot")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cache().Force(t.Context(), inventory.Item{SKU: inv.SKU, Stock: inv.Stock, Version: inv.Version}); err != nil {
		t.Fatal(err)
	}
	f.stock("ab-hot", 3) // sold elsewhere: the cache still says 10
	s := f.redisReplica(order.Config{Guard: storage.GuardAtomic})
	keys := make([]string, 5)
	for i := range keys {
		keys[i] = fmt.Sprintf("ab-%d", i)
	}
	recs := f.queued(s, "ab-hot", keys, func(int) int { return 1 })
	for i, r := range recs {
		want := http.StatusConflict
		if i < 3 {
			want = http.StatusCreated
		}
		if r.Code != want {
			t.Errorf("order %d: %d %s, want %d", i, r.Code, r.Body, want)
		}
	}
	if a := f.audit("ab-hot"); a.Stock != 0 || a.Orders != 3 {
		t.Errorf("audit %+v, want 3 orders, stock 0", a)
	}
}

// TestRetryRacesItsOwnTry: a retry sent while its first try still queues
// (a lost reply, a client timeout) meets the first in the next batch. With
// one unit in stock, the first takes it; the retry must get that order back
// (200), not out_of_stock: 409 would tell the client to stop while it holds
// an order it never learns about. Orders and holds alike.
func TestRetryRacesItsOwnTry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.redisReplica(order.Config{Guard: storage.GuardVersion})
	h := s.Handler()

	f.stock("rr-order", 1)
	recs := f.queued(s, "rr-order", []string{"K", "K"}, func(int) int { return 1 })
	if recs[0].Code != http.StatusCreated || recs[1].Code != http.StatusOK {
		t.Errorf("order and its retry: %d %s, %d %s; want 201 and 200", recs[0].Code, recs[0].Body, recs[1].Code, recs[1].Body)
	} else if a, b := decodeOrder(t, recs[0]).ID, decodeOrder(t, recs[1]).ID; a != b {
		t.Errorf("the retry answered order %s, the first try %s", b, a)
	}

	f.stock("rr-hold", 1)
	lease := f.holdLock("rr-hold")
	holds := make([]*httptest.ResponseRecorder, 2)
	var wg sync.WaitGroup
	for i := range holds {
		wg.Go(func() { holds[i] = hold(h, 0, "HK", "rr-hold", 1) })
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	codes := map[int]int{holds[0].Code: 1}
	codes[holds[1].Code]++
	if codes[http.StatusCreated] != 1 || codes[http.StatusOK] != 1 {
		t.Errorf("hold and its retry: %d %s, %d %s; want a 201 and a 200", holds[0].Code, holds[0].Body, holds[1].Code, holds[1].Body)
	}
	if a := f.audit("rr-order"); a.Orders != 1 || a.Stock != 0 {
		t.Errorf("MySQL %+v, want the one order", a)
	}
}

// TestBatchOutlivesItsRequests: one replica, the lock granted within 1s,
// each request bounded at 2s, 100ms of work per order: 40 keyed orders for
// one SKU at once make batches that run past their requests' time. An
// order answered 503 must not be in MySQL (its client retries without a
// key and buys twice), every 201 must be, and the created metric counts
// what committed.
func TestBatchOutlivesItsRequests(t *testing.T) {
	t.Parallel()
	const clients = 40
	f := newFixture(t)
	f.stock("bo-hot", 100)
	locker, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Close() })
	s := f.service(locker, order.Config{Lock: "redis", Guard: storage.GuardVersion,
		LockWait: time.Second, RequestTimeout: 2 * time.Second, WorkDelay: 100 * time.Millisecond})
	// Another replica holds the lock while the orders queue, so that they
	// make one batch of 4s of work, as a first small batch made it when the
	// fault was found; it lets go once all have queued, within their lock
	// wait.
	lease := f.holdLock("bo-hot")
	recs := make([]*httptest.ResponseRecorder, clients)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			<-start
			recs[i] = post(s.Handler(), "bo-hot", 1, "Idempotency-Key", fmt.Sprintf("bo-%02d", i))
		})
	}
	close(start)
	begin := time.Now()
	for order.Queued(s, "bo-hot") < clients && time.Since(begin) < 800*time.Millisecond {
		time.Sleep(time.Millisecond)
	}
	queued := order.Queued(s, "bo-hot")
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d queued in %v", queued, time.Since(begin).Round(time.Millisecond))
	wg.Wait()
	// A batch may still be writing orders answered already: MySQL is read
	// once the SKU's drain has ended.
	for deadline := time.Now().Add(30 * time.Second); order.Draining(s, "bo-hot"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the SKU's batches still run after 30s")
		}
	}

	codes := map[string]int{}
	lied := 0 // answered 503, yet in MySQL
	for i, r := range recs {
		code := strconv.Itoa(r.Code)
		if r.Code >= 300 {
			code += " " + errorCode(t, r)
		}
		codes[code]++
		_, err := f.store.OrderByKey(t.Context(), fmt.Sprintf("bo-%02d", i))
		inMySQL := err == nil
		if err != nil && !errors.Is(err, storage.ErrNotFound) {
			t.Fatal(err)
		}
		switch r.Code {
		case http.StatusCreated:
			if !inMySQL {
				t.Errorf("order %d answered 201, not in MySQL", i)
			}
		case http.StatusServiceUnavailable:
			if inMySQL {
				lied++
			}
		default:
			t.Errorf("order %d: %d %s", i, r.Code, r.Body)
		}
	}
	a := f.audit("bo-hot")
	created := metric(t, s.Handler(), `oversold_orders_total{guard="version",lock="redis",outcome="created",replica="r1"}`)
	t.Logf("answers %v; MySQL: %d orders; created metric %d", codes, a.Orders, created)
	if a.Orders == 0 {
		t.Errorf("nothing was sold: the lock was not granted within the lock wait, and the batch this test is about never ran")
	}
	if lied > 0 {
		t.Errorf("%d of %d answered 503 while committed", lied, clients)
	}
	if created != a.Orders || int64(codes["201"]) != a.Orders {
		t.Errorf("%d answered 201, created metric %d, %d orders in MySQL: want all three equal", codes["201"], created, a.Orders)
	}
}

// metric is the value of one series on h's /metrics.
func metric(t *testing.T, h http.Handler, series string) int64 {
	t.Helper()
	body := call(h, http.MethodGet, "/metrics", "").Body.String()
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no series %s in /metrics", series)
	return 0
}

// TestQueuedOrderLeaves: a client that gives up while its order queues
// (the lock held elsewhere) is answered at once, 503, and its order leaves
// the queue: the batch that sells the order queued beside it writes
// nothing of it.
func TestQueuedOrderLeaves(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("lv", 10)
	s := f.redisReplica(order.Config{Guard: storage.GuardVersion})
	lease := f.holdLock("lv")
	ctx, cancel := context.WithCancel(t.Context())
	recs := make([]*httptest.ResponseRecorder, 2)
	left := make(chan struct{})
	wait := f.inOrder(s, "lv", 2, func(i int) {
		body := `{"sku":"lv","quantity":1}`
		req := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("lv-%d", i))
		if i == 0 {
			req = req.WithContext(ctx)
			defer close(left)
		}
		recs[i] = httptest.NewRecorder()
		s.Handler().ServeHTTP(recs[i], req)
	})
	cancel()
	select {
	case <-left:
	case <-time.After(30 * time.Second):
		t.Fatal("the client that left was not answered while the lock was held")
	}
	if n := order.Queued(s, "lv"); n != 1 {
		t.Errorf("%d orders queued after one left, want 1", n)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait()
	if recs[0].Code != http.StatusServiceUnavailable || recs[1].Code != http.StatusCreated {
		t.Errorf("the order that left: %d %s; the other: %d %s; want 503 and 201", recs[0].Code, recs[0].Body, recs[1].Code, recs[1].Body)
	}
	if _, err := f.store.OrderByKey(t.Context(), "lv-0"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("the order that left: %v, want not in MySQL", err)
	}
	if a := f.audit("lv"); a.Orders != 1 || a.Stock != 9 {
		t.Errorf("audit %+v, want the one order that stayed", a)
	}
}

// noInvalidate is a stock cache whose deletes fail, as a stalled Redis's
// do: the fencing guard must not write then.
type noInvalidate struct{ order.Cache }

func (noInvalidate) Invalidate(ctx context.Context, sku string) error {
	return errors.New("redis: i/o timeout")
}

// TestShortOrderSharesAPreWriteFailure: in a batch of three orders of one
// with two in stock, the third is short only beside the other two. When a
// step before the write fails (the lease lost, the cache entry that the
// fencing guard must delete first), the batch writes nothing: the third
// is not out_of_stock, whose stock is still there (sent again, it is
// sold). It shares the batch's answer.
func TestShortOrderSharesAPreWriteFailure(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	closed := make(chan struct{})
	close(closed)
	for _, c := range []struct {
		name  string
		guard storage.Guard
		lost  bool                          // every lease lost from its grant
		wrap  func(order.Cache) order.Cache // nil: the cache as it is
		want  string                        // the batch's answer
	}{
		{"lease-lost", storage.GuardVersion, true, nil, "lock_lost"},
		{"cache-stalled", storage.GuardFencing, false, func(c order.Cache) order.Cache { return noInvalidate{c} }, "unavailable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sku := "pw-" + c.name
			f.stock(sku, 2)
			l, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			var locker order.Locker = l
			if c.lost {
				locker = lostLocker{Locker: l, lose: closed}
			}
			s := f.serviceWith(f.openStore(), c.wrap, locker, order.Config{Lock: "redis", Guard: c.guard, LockWait: time.Minute})
			keys := []string{sku + "-0", sku + "-1", sku + "-2"}
			recs := f.queued(s, sku, keys, func(int) int { return 1 })
			for i, r := range recs {
				if r.Code < 300 {
					t.Errorf("order %d: %d %s, want %s", i, r.Code, r.Body, c.want)
				} else if code := errorCode(t, r); code != c.want {
					t.Errorf("order %d: %d %s, want %s: the batch wrote nothing", i, r.Code, code, c.want)
				}
			}
			if a := f.audit(sku); a.Orders != 0 || a.Stock != 2 {
				t.Fatalf("audit %+v, want nothing written", a)
			}
			// The stock the third order was refused against is still there.
			again := f.redisReplica(order.Config{Guard: storage.GuardVersion})
			if r := post(again.Handler(), sku, 1, "Idempotency-Key", keys[2]); r.Code != http.StatusCreated {
				t.Errorf("order 2 sent again: %d %s, want 201", r.Code, r.Body)
			}
		})
	}
}
