package order_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// redisReplicas are n replicas sharing the redis lock, each with its own
// locker and connections, as orderd processes would.
func (f *fixture) redisReplicas(n int, cfg order.Config) []http.Handler {
	f.t.Helper()
	hs := make([]http.Handler, n)
	for i := range hs {
		c := cfg
		c.Instance = fmt.Sprintf("r%d", i+1)
		hs[i] = f.redisReplica(c).Handler()
	}
	return hs
}

// redisReplica is one replica with its own redis locker (instance r1 unless
// cfg names one), LockWait a minute.
func (f *fixture) redisReplica(cfg order.Config) *order.Service {
	f.t.Helper()
	locker, err := backends.Open(f.t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { locker.Close() })
	if cfg.Instance == "" {
		cfg.Instance = "r1"
	}
	cfg.Lock, cfg.LockWait = "redis", time.Minute
	return f.service(locker, cfg)
}

// TestSKUSpellings: hot-1, HOT-1 and Hot-1 are three SKUs everywhere. With
// one of them stocked, orders for all three across replicas under the
// redis lock and guard none sell exactly its stock (the others are
// unknown); with all three stocked, each sells exactly its own. A store
// that took the spellings for one row while the lock took them for three
// would have three holders write one row: oversell.
func TestSKUSpellings(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const stock, perSpelling = 40, 40
	hs := f.redisReplicas(3, order.Config{Guard: storage.GuardNone, WorkDelay: time.Millisecond})
	for _, all := range []bool{false, true} {
		t.Run(fmt.Sprintf("all stocked %v", all), func(t *testing.T) {
			base := fmt.Sprintf("sp%v", all)
			spellings := []string{base + "-hot-1", base + "-HOT-1", base + "-Hot-1"}
			f.stock(spellings[0], stock)
			if all {
				f.stock(spellings[1], stock)
				f.stock(spellings[2], stock)
			}
			recs := make([]*httptest.ResponseRecorder, perSpelling*len(spellings))
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range recs {
				wg.Go(func() {
					<-start
					recs[i] = post(hs[i%len(hs)], spellings[i%len(spellings)], 1)
				})
			}
			close(start)
			wg.Wait()
			created := map[string]int{}
			for _, r := range recs {
				switch r.Code {
				case http.StatusCreated:
					created[decodeOrder(t, r).SKU]++
				case http.StatusNotFound, http.StatusConflict:
				default:
					t.Errorf("answer %d %s", r.Code, r.Body)
				}
			}
			for i, sku := range spellings {
				if i > 0 && !all {
					if created[sku] != 0 {
						t.Errorf("%s: %d orders acknowledged for a SKU that was never stocked", sku, created[sku])
					}
					continue
				}
				a := f.audit(sku)
				if created[sku] != stock || a.Ordered != stock || a.Stock != 0 {
					t.Errorf("%s: %d acknowledged, %d ordered in MySQL, stock left %d; want exactly %d sold", sku, created[sku], a.Ordered, a.Stock, stock)
				}
			}
		})
	}
}

// TestKeySpellings: Key-a, key-A and "Key-a " are three keys: three orders.
func TestKeySpellings(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("ks", 10)
	h := f.service(nil, order.Config{Guard: storage.GuardAtomic}).Handler()
	ids := map[string]bool{}
	for _, key := range []string{"Key-a", "key-A", "Key-a "} {
		rec := post(h, "ks", 1, "Idempotency-Key", key)
		if rec.Code != http.StatusCreated {
			t.Fatalf("key %q: %d %s, want 201: a new key", key, rec.Code, rec.Body)
		}
		ids[decodeOrder(t, rec).ID] = true
	}
	if rec := post(h, "ks", 1, "Idempotency-Key", "key-A"); rec.Code != http.StatusOK || !ids[decodeOrder(t, rec).ID] {
		t.Errorf("key-A again: %d %s, want 200 with its own order", rec.Code, rec.Body)
	}
	if a := f.audit("ks"); len(ids) != 3 || a.Orders != 3 || a.Stock != 7 {
		t.Errorf("%d distinct orders, audit %+v; want 3 orders and stock 7", len(ids), a)
	}
	if rec := call(h, http.MethodGet, "/v1/orders/"+strings.ToUpper(firstKey(ids)), ""); rec.Code != http.StatusNotFound {
		t.Errorf("GET the upper-cased id: %d, want 404: ids are exact strings", rec.Code)
	}
}

func firstKey(m map[string]bool) string {
	for k := range m {
		return k
	}
	return ""
}

// TestKeyReused: a key sent again with another SKU or quantity is refused
// with 422 and changes nothing, whether the first order is found by the
// replay check or by the UNIQUE index after a concurrent insert. Requests
// with the first body are replays (200) of the one order.
func TestKeyReused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("kr-a", 100)
	f.stock("kr-b", 100)
	h := f.service(nil, order.Config{Guard: storage.GuardAtomic}).Handler()

	// The replay path.
	first := post(h, "kr-a", 1, "Idempotency-Key", "k1")
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	for _, c := range []struct {
		sku string
		q   int
	}{{"kr-a", 2}, {"kr-b", 1}} {
		rec := post(h, c.sku, c.q, "Idempotency-Key", "k1")
		if code := errorCode(t, rec); rec.Code != http.StatusUnprocessableEntity || code != "idempotency_key_reused" {
			t.Errorf("k1 with %s×%d: %d %s, want 422 idempotency_key_reused", c.sku, c.q, rec.Code, code)
		}
	}
	if a, b := f.audit("kr-a"), f.audit("kr-b"); a.Stock != 99 || a.Orders != 1 || b.Stock != 100 || b.Orders != 0 {
		t.Errorf("after reuses: kr-a %+v, kr-b %+v; want only the first order", a, b)
	}

	// The duplicate-key path: 30 requests under one new key at once, two
	// bodies. Exactly one order; every request with its body is a replay
	// of it, every other one a 422.
	hs := []http.Handler{h, f.service(nil, order.Config{Instance: "r2", Guard: storage.GuardAtomic}).Handler()}
	recs := make([]*httptest.ResponseRecorder, 30)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range recs {
		wg.Go(func() {
			<-start
			recs[i] = post(hs[i%2], "kr-b", 1+i%2, "Idempotency-Key", "k2")
		})
	}
	close(start)
	wg.Wait()
	var winner order.Order
	for _, r := range recs {
		if r.Code == http.StatusCreated {
			if winner.ID != "" {
				t.Fatalf("two 201s under one key")
			}
			winner = decodeOrder(t, r)
		}
	}
	if winner.ID == "" {
		t.Fatal("no request under k2 was placed")
	}
	for i, r := range recs {
		q := int64(1 + i%2)
		switch {
		case r.Code == http.StatusCreated:
		case q == winner.Quantity:
			if r.Code != http.StatusOK || decodeOrder(t, r).ID != winner.ID {
				t.Errorf("request %d (same body as the winner): %d %s, want 200 with its order", i, r.Code, r.Body)
			}
		default:
			if code := errorCode(t, r); r.Code != http.StatusUnprocessableEntity || code != "idempotency_key_reused" {
				t.Errorf("request %d (other body): %d %s, want 422", i, r.Code, code)
			}
		}
	}
	if b := f.audit("kr-b"); b.Orders != 1 || b.Stock != 100-winner.Quantity {
		t.Errorf("kr-b %+v: want one order of %d", b, winner.Quantity)
	}
}

// TestErrorBodiesSayNothingInternal: no error answer carries a stock
// figure, an address or a driver message, whatever failed.
func TestErrorBodiesSayNothingInternal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("qqzz", 3)
	h := f.service(nil, order.Config{Guard: storage.GuardAtomic}).Handler()
	down := f.service(downLocker{}, order.Config{Lock: "redis"}).Handler()
	mysqlDown := f.serviceWith(downStore{f.openStore()}, nil, nil, order.Config{}).Handler()
	for _, rec := range []*httptest.ResponseRecorder{
		post(h, "qqzz", 7),      // out of stock: must not say 3
		post(h, "qqzz-nope", 1), // unknown
		post(down, "qqzz", 1),   // lock server down
		call(mysqlDown, http.MethodGet, "/v1/inventory/qqzz", ""), // MySQL down
		call(mysqlDown, http.MethodGet, "/v1/orders/0190a5c8-0000-7000-8000-000000000000", ""),
		call(h, http.MethodGet, "/v1/orders/0190a5c8-0000-7000-8000-000000000000", ""),
	} {
		var body struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%d %s: %v", rec.Code, rec.Body, err)
		}
		m := body.Error.Message
		if m == "" || strings.ContainsAny(m, "0123456789") || strings.Contains(m, "storage:") || strings.Contains(m, "locking:") ||
			strings.Contains(m, "dial") || strings.Contains(m, "qqzz") {
			t.Errorf("%d %s: message %q tells more than what the client did wrong", rec.Code, body.Error.Code, m)
		}
	}
}
