package order_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// wedge puts an entry claiming a far newer version than MySQL's in the
// cache, as a restored database (same identity, older versions) leaves.
func (f *fixture) wedge(sku string, stock int64) {
	f.t.Helper()
	if err := f.cache().Force(f.t.Context(), inventory.Item{SKU: sku, Stock: stock, Version: 1_000_000}); err != nil {
		f.t.Fatal(err)
	}
}

// TestCacheCannotWedge: an entry newer than MySQL does not stop the
// service. The version guard's first refusal settles it and the retry
// sells; an admin's PUT overwrites it; another database on the same Redis
// and prefix never sees it.
func TestCacheCannotWedge(t *testing.T) {
	t.Parallel()
	f := newFixture(t)

	t.Run("version guard settles it", func(t *testing.T) {
		f.stock("wv", 5)
		f.wedge("wv", 999)
		hs := f.redisReplicas(2, order.Config{Guard: storage.GuardVersion})
		created := 0
		for i := range 8 {
			rec := post(hs[i%2], "wv", 1)
			if rec.Code == http.StatusCreated {
				created++
			} else if rec.Code != http.StatusConflict {
				t.Errorf("answer %d %s", rec.Code, rec.Body)
			}
		}
		if a := f.audit("wv"); created != 5 || a.Stock != 0 || a.Ordered != 5 {
			t.Errorf("%d created, audit %+v; want exactly the 5 in MySQL sold", created, a)
		}
	})

	t.Run("PUT overwrites it", func(t *testing.T) {
		f.stock("wp", 1)
		f.wedge("wp", 999)
		hs := f.redisReplicas(2, order.Config{Guard: storage.GuardNone, AdminToken: adminToken})
		rec := call(hs[0], http.MethodPut, "/v1/inventory/wp", `{"stock":6}`, "Authorization", "Bearer "+adminToken)
		if rec.Code != http.StatusOK {
			t.Fatalf("PUT: %d %s", rec.Code, rec.Body)
		}
		created := 0
		for i := range 10 {
			if rec := post(hs[i%2], "wp", 1); rec.Code == http.StatusCreated {
				created++
			}
		}
		if a := f.audit("wp"); created != 6 || a.Stock != 0 || a.Ordered != 6 {
			t.Errorf("guard none after PUT: %d created, audit %+v; want exactly the 6 set sold", created, a)
		}
	})

	t.Run("another database never sees it", func(t *testing.T) {
		// Deployment A's entry for "shared" at a high version, in the
		// same Redis under the same prefix as deployment B.
		f.stock("shared", 50)
		for range 3 {
			if rec := post(f.service(nil, order.Config{Guard: storage.GuardAtomic}).Handler(), "shared", 1); rec.Code != http.StatusCreated {
				t.Fatalf("A's order: %d %s", rec.Code, rec.Body)
			}
		}
		other := &fixture{t: t, dsn: testbed.MySQL(t), redis: f.redis, prefix: f.prefix}
		other.store = other.openStore()
		other.stock("shared", 2)
		hs := other.redisReplicas(2, order.Config{Guard: storage.GuardNone})
		created := 0
		for i := range 6 {
			if rec := post(hs[i%2], "shared", 1); rec.Code == http.StatusCreated {
				created++
			}
		}
		if a := other.audit("shared"); created != 2 || a.Stock != 0 || a.Ordered != 2 {
			t.Errorf("B: %d created, audit %+v; want exactly B's 2 sold", created, a)
		}
	})

	t.Run("entries expire", func(t *testing.T) {
		f.stock("wt", 3)
		h := f.service(nil, order.Config{Guard: storage.GuardAtomic}).Handler()
		if rec := post(h, "wt", 1); rec.Code != http.StatusCreated {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		rdb, _ := redisconn.Open(f.redis)
		defer rdb.Close()
		keys, err := rdb.Keys(t.Context(), f.prefix+"*:stock:wt").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("cache keys %v, %v: want one", keys, err)
		}
		if ttl := rdb.PTTL(t.Context(), keys[0]).Val(); ttl <= 0 || ttl > inventory.EntryTTL {
			t.Errorf("entry %s has TTL %v, want (0, %v]", keys[0], ttl, inventory.EntryTTL)
		}
	})
}

// TestOutOfStockIsConfirmed: stock added in MySQL outside PUT (the cache
// still says 0) is sold: the cache's "not enough" is checked against MySQL.
func TestOutOfStockIsConfirmed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("oos", 1)
	hs := f.redisReplicas(1, order.Config{Guard: storage.GuardVersion})
	if rec := post(hs[0], "oos", 1); rec.Code != http.StatusCreated {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if rec := post(hs[0], "oos", 1); rec.Code != http.StatusConflict {
		t.Fatalf("second order: %d %s, want 409 out_of_stock", rec.Code, rec.Body)
	}
	db, err := sql.Open("mysql", f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(t.Context(), "UPDATE inventory SET stock = 2 WHERE sku = 'oos'"); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if rec := post(hs[0], "oos", 1); rec.Code != http.StatusCreated {
			t.Errorf("order %d after stock was added in MySQL: %d %s, want 201", i, rec.Code, rec.Body)
		}
	}
	if rec := post(hs[0], "oos", 1); rec.Code != http.StatusConflict {
		t.Errorf("order past the added stock: %d %s, want 409", rec.Code, rec.Body)
	}
}

// countingStore counts the stock reads that reach MySQL, and slows them so
// that concurrent misses overlap.
type countingStore struct {
	order.Store
	reads atomic.Int32
}

func (s *countingStore) Inventory(ctx context.Context, sku string) (storage.Inventory, error) {
	s.reads.Add(1)
	time.Sleep(300 * time.Millisecond)
	return s.Store.Inventory(ctx, sku)
}

// TestMissesAreSingleFlight: 40 orders for one SKU missing from the cache,
// at once in one replica, share one MySQL read (two when the machine is so
// slow that a miss joins after the first read ended; 40 without sharing).
func TestMissesAreSingleFlight(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("sf", 100)
	store := &countingStore{Store: f.openStore()}
	h := f.serviceWith(store, nil, nil, order.Config{Guard: storage.GuardAtomic}).Handler()
	for _, r := range burst([]http.Handler{h}, "sf", 40) {
		if r.Code != http.StatusCreated {
			t.Errorf("%d %s", r.Code, r.Body)
		}
	}
	if n := store.reads.Load(); n > 2 {
		t.Errorf("%d MySQL reads for 40 concurrent misses, want 1", n)
	}
}

// TestUnknownSKUTakesNoLock: orders for SKUs that do not exist are 404
// before any lock: no key of theirs appears in Redis (lock, queue, fence or
// cache), whichever replica they reach.
func TestUnknownSKUTakesNoLock(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	hs := f.redisReplicas(2, order.Config{Guard: storage.GuardFencing})
	marker := fmt.Sprintf("ghost%d", time.Now().UnixNano())
	for i := range 50 {
		rec := post(hs[i%2], fmt.Sprintf("%s-%d", marker, i), 1)
		if code := errorCode(t, rec); rec.Code != http.StatusNotFound || code != "unknown_sku" {
			t.Fatalf("unknown SKU: %d %s, want 404 unknown_sku", rec.Code, code)
		}
	}
	rdb, _ := redisconn.Open(f.redis)
	defer rdb.Close()
	if keys, err := rdb.Keys(t.Context(), "*"+marker+"*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("Redis keys for unknown SKUs: %v (%v), want none", keys, err)
	}
}

// commitThenFail commits the write, then reports the error a connection
// lost during COMMIT gives: the outcome is unknown to the flow.
type commitThenFail struct{ order.Store }

func (s commitThenFail) PlaceOrder(ctx context.Context, w storage.Write, beforeCommit func() error) (storage.Inventory, error) {
	if _, err := s.Store.PlaceOrder(ctx, w, beforeCommit); err != nil {
		return storage.Inventory{}, err
	}
	return storage.Inventory{}, errors.New("invalid connection")
}

// TestCommitOutcome: a commit reported failed that MySQL holds is answered
// 201 with the order; a client that leaves during the write does not
// cancel it.
func TestCommitOutcome(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("co", 5)
	h := f.serviceWith(commitThenFail{f.openStore()}, nil, nil, order.Config{Guard: storage.GuardVersion}).Handler()
	rec := post(h, "co", 1, "Idempotency-Key", "co-1")
	if rec.Code != http.StatusCreated {
		t.Fatalf("committed but reported failed: %d %s, want 201", rec.Code, rec.Body)
	}
	if o := decodeOrder(t, rec); o.SKU != "co" {
		t.Errorf("order %+v", o)
	}

	// The client leaves as the write starts.
	gone := &cancelAtWrite{Store: f.openStore()}
	svc := f.serviceWith(gone, nil, nil, order.Config{Guard: storage.GuardVersion})
	ctx, cancel := context.WithCancel(t.Context())
	gone.cancel = cancel
	o, _, err := svc.Place(ctx, order.Request{SKU: "co", Quantity: 1, Key: "co-2"})
	if err != nil {
		t.Fatalf("Place with the client gone during the write: %v, want the order committed", err)
	}
	if _, err := f.store.Order(t.Context(), o.ID); err != nil {
		t.Errorf("order %s: %v", o.ID, err)
	}
	if a := f.audit("co"); a.Orders != 2 || a.Stock != 3 {
		t.Errorf("audit %+v, want 2 orders, stock 3", a)
	}
}

// cancelAtWrite cancels the request's context as step 6 begins.
type cancelAtWrite struct {
	order.Store
	cancel context.CancelFunc
}

func (s *cancelAtWrite) PlaceOrder(ctx context.Context, w storage.Write, beforeCommit func() error) (storage.Inventory, error) {
	s.cancel()
	time.Sleep(10 * time.Millisecond)
	return s.Store.PlaceOrder(ctx, w, beforeCommit)
}

// TestRedisDownStillSells: Redis stopped in the middle of a stream of
// orders. Replicas with the guards that check their read in MySQL (version
// under the mysql lock, atomic without a lock) keep selling exactly the
// stock, and /readyz stays 200 with the cache degraded; guard none, which
// trusts the cache, answers 503 rather than sell blind.
func TestRedisDownStillSells(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv, err := testbed.StartRedis(t.Context(), testbed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	own := &fixture{t: t, dsn: f.dsn, redis: srv.Addr, prefix: f.prefix, store: f.store}

	const stock = 60
	type setup struct {
		name  string
		lock  string
		guard storage.Guard
	}
	setups := []setup{{"mysql/version", "mysql", storage.GuardVersion}, {"none/atomic", "none", storage.GuardAtomic}}
	replicas := map[string][]http.Handler{}
	for _, c := range setups {
		f.stock("rd-"+string(c.guard), stock)
		for i := range 3 {
			var locker order.Locker
			if c.lock == "mysql" {
				l, err := backends.Open(t.Context(), "mysql", backends.Config{MySQLDSN: f.dsn, TTL: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
				locker = l
			}
			replicas[c.name] = append(replicas[c.name], own.service(locker, order.Config{
				Instance: fmt.Sprintf("r%d", i), Lock: c.lock, Guard: c.guard, LockWait: time.Minute,
			}).Handler())
		}
	}
	f.stock("rd-none", stock)
	blind := own.redisFreeLockReplica(storage.GuardNone)

	var wg sync.WaitGroup
	results := map[string][]*httptest.ResponseRecorder{}
	var mu sync.Mutex
	for _, c := range setups {
		wg.Go(func() {
			for i := range stock + 20 {
				if i == 20 {
					if err := srv.Stop(); err != nil {
						t.Error(err)
					}
				}
				rec := post(replicas[c.name][i%3], "rd-"+string(c.guard), 1)
				mu.Lock()
				results[c.name] = append(results[c.name], rec)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, c := range setups {
		created := 0
		for _, r := range results[c.name] {
			switch r.Code {
			case http.StatusCreated:
				created++
			case http.StatusConflict:
			default:
				t.Errorf("%s: %d %s", c.name, r.Code, r.Body)
			}
		}
		if a := f.audit("rd-" + string(c.guard)); created != stock || a.Ordered != stock || a.Stock != 0 {
			t.Errorf("%s with Redis stopped: %d created, audit %+v; want exactly %d sold", c.name, created, a, stock)
		}
		rec := call(replicas[c.name][0], http.MethodGet, "/readyz", "")
		if rec.Code != http.StatusOK || !jsonHas(rec, "cache", "degraded") {
			t.Errorf("%s readyz with Redis stopped: %d %s, want 200 with cache degraded", c.name, rec.Code, rec.Body)
		}
	}
	if rec := post(blind, "rd-none", 1); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Errorf("guard none with Redis stopped: %d %s, want 503 with Retry-After", rec.Code, rec.Body)
	}
	if a := f.audit("rd-none"); a.Orders != 0 {
		t.Errorf("guard none sold %d with Redis stopped, want 0", a.Orders)
	}
}

// redisFreeLockReplica is one replica under the mysql lock.
func (f *fixture) redisFreeLockReplica(guard storage.Guard) http.Handler {
	f.t.Helper()
	l, err := backends.Open(f.t.Context(), "mysql", backends.Config{MySQLDSN: f.dsn, TTL: 5 * time.Second})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { l.Close() })
	return f.service(l, order.Config{Lock: "mysql", Guard: guard}).Handler()
}

// jsonHas reports whether the answer is a JSON object with field = value.
func jsonHas(rec *httptest.ResponseRecorder, field, value string) bool {
	var m map[string]any
	return json.Unmarshal(rec.Body.Bytes(), &m) == nil && m[field] == value
}

// stallAfterCommit commits, then tells committed and waits for resume:
// a holder paused or dying between its commit and its cache update.
type stallAfterCommit struct {
	order.Store
	committed, resume chan struct{}
}

func (s stallAfterCommit) PlaceOrder(ctx context.Context, w storage.Write, beforeCommit func() error) (storage.Inventory, error) {
	inv, err := s.Store.PlaceOrder(ctx, w, beforeCommit)
	close(s.committed)
	<-s.resume
	return inv, err
}

// TestNoStaleEntryAfterCommit: under the guards that trust the cached read
// (none, fencing), a holder stalled between its commit and its cache
// update leaves no entry behind MySQL for the next holder to build on; the
// version guard, which checks its read, keeps its entry.
func TestNoStaleEntryAfterCommit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rdb, _ := redisconn.Open(f.redis)
	defer rdb.Close()
	for _, c := range []struct {
		guard storage.Guard
		entry bool // an entry may be left (it is checked by the guard)
	}{{storage.GuardNone, false}, {storage.GuardFencing, false}, {storage.GuardVersion, true}} {
		t.Run(string(c.guard), func(t *testing.T) {
			sku := "stall-" + string(c.guard)
			f.stock(sku, 5)
			locker, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer locker.Close()
			store := stallAfterCommit{Store: f.openStore(), committed: make(chan struct{}), resume: make(chan struct{})}
			warm := f.service(nil, order.Config{Guard: storage.GuardAtomic}).Handler()
			if rec := post(warm, sku, 1); rec.Code != http.StatusCreated { // fills the cache
				t.Fatalf("warm-up: %d %s", rec.Code, rec.Body)
			}
			h := f.serviceWith(store, nil, locker, order.Config{Lock: "redis", Guard: c.guard}).Handler()
			done := make(chan int)
			go func() { done <- post(h, sku, 1).Code }()
			<-store.committed
			n, err := rdb.Exists(t.Context(), f.prefix+f.store.DatabaseIdentity()+":stock:"+sku).Result()
			close(store.resume)
			if code := <-done; code != http.StatusCreated {
				t.Errorf("stalled order: %d", code)
			}
			if err != nil || (n == 1) != c.entry {
				t.Errorf("cache entry present between commit and update: %v (%v); want %v", n == 1, err, c.entry)
			}
		})
	}
}
