package order_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// TestRestockRacesNoSale: admins restock a SKU while replicas sell it.
// Each restock reads the SKU and PUTs stock+100 with If-Match: its version,
// so every successful PUT adds exactly 100 to the stock it replaced. Then
// conservation holds exactly: final stock = initial + 100 × restocks -
// sold. A sale that read before a PUT and wrote after it (a restock lost)
// or a PUT applied over a concurrent sale (a sale lost) breaks it, under
// every guard. Under load a request may be answered 503: an order so
// answered must not exist (the count in MySQL is the count acknowledged),
// and a PUT so answered may or may not have been applied (a 503
// unavailable can be a commit whose outcome is unknown), so it counts as
// 0 or 100, never as anything else; a 503 lock_timeout wrote nothing.
func TestRestockRacesNoSale(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, c := range []struct {
		lock  string
		guard storage.Guard
	}{
		{"redis", storage.GuardNone},
		{"redis", storage.GuardVersion},
		{"redis", storage.GuardFencing},
		{"none", storage.GuardAtomic},
	} {
		t.Run(c.lock+"/"+string(c.guard), func(t *testing.T) {
			sku := "rs-" + string(c.guard)
			const initial = 50
			f.stock(sku, initial)
			cfg := order.Config{Guard: c.guard, AdminToken: adminToken, WorkDelay: 2 * time.Millisecond}
			var hs []http.Handler
			if c.lock == "redis" {
				hs = f.redisReplicas(3, cfg)
			} else {
				for i := range 3 {
					cfg.Instance = fmt.Sprintf("r%d", i)
					hs = append(hs, f.service(nil, cfg).Handler())
				}
			}

			var restocks, refusedPuts, doubtfulPuts, sold atomic.Int64
			stop := make(chan struct{})
			start := make(chan struct{})
			var sellers, admins sync.WaitGroup
			for w := range 3 {
				sellers.Go(func() {
					<-start
					for i := range 20 {
						switch rec := post(hs[(w+i)%3], sku, 1); rec.Code {
						case http.StatusCreated:
							sold.Add(1)
						case http.StatusConflict, http.StatusServiceUnavailable:
						default:
							t.Errorf("order: %d %s", rec.Code, rec.Body)
							return
						}
						time.Sleep(8 * time.Millisecond) // room for the admins' read-then-PUT
					}
				})
			}
			for a := range 2 {
				admins.Go(func() {
					<-start
					// Restock while the sellers sell, then twice more after.
					for i, after := 0, 0; after < 2; i++ {
						select {
						case <-stop:
							after++
						default:
						}
						h := hs[(a+i)%3]
						var inv struct{ Stock, Version int64 }
						rec := call(h, http.MethodGet, "/v1/inventory/"+sku, "")
						if err := json.Unmarshal(rec.Body.Bytes(), &inv); err != nil || rec.Code != http.StatusOK {
							t.Errorf("GET: %d %s", rec.Code, rec.Body)
							return
						}
						body := fmt.Sprintf(`{"stock":%d}`, inv.Stock+100)
						rec = call(h, http.MethodPut, "/v1/inventory/"+sku, body,
							"Authorization", "Bearer "+adminToken, "If-Match", strconv.FormatInt(inv.Version, 10))
						switch rec.Code {
						case http.StatusOK:
							restocks.Add(1)
						case http.StatusPreconditionFailed:
							refusedPuts.Add(1)
						case http.StatusServiceUnavailable:
							if errorCodeOf(rec.Body.Bytes()) != "lock_timeout" {
								doubtfulPuts.Add(1)
							}
						default:
							t.Errorf("PUT: %d %s", rec.Code, rec.Body)
							return
						}
						time.Sleep(2 * time.Millisecond)
					}
				})
			}
			close(start)
			sellers.Wait()
			close(stop)
			admins.Wait()

			a := f.audit(sku)
			want := initial + 100*restocks.Load() - a.Ordered
			// applied is how many of the doubtful PUTs the stock says were
			// applied: a whole number from 0 to all of them.
			applied := (a.Stock - want) / 100
			t.Logf("%d restocks (%d refused, %d doubtful), %d sold (%d in MySQL), final stock %d",
				restocks.Load(), refusedPuts.Load(), doubtfulPuts.Load(), sold.Load(), a.Ordered, a.Stock)
			if (a.Stock-want)%100 != 0 || applied < 0 || applied > doubtfulPuts.Load() || a.Ordered != sold.Load() || a.Stock < 0 {
				t.Errorf("final stock %d, want %d = %d + 100 × %d restocks (+ 100 × up to %d doubtful) - %d sold (%d acknowledged)",
					a.Stock, want, initial, restocks.Load(), doubtfulPuts.Load(), a.Ordered, sold.Load())
			}
			if restocks.Load() == 0 || a.Ordered == 0 {
				t.Errorf("%d restocks and %d sales: the race did not happen", restocks.Load(), a.Ordered)
			}
		})
	}
}

// heldWrite stops each order's write until proceed is closed, after
// telling writing: the seller then holds the lock with its read done.
type heldWrite struct {
	order.Store
	writing chan struct{}
	proceed chan struct{}
}

func (s heldWrite) PlaceOrder(ctx context.Context, w storage.Write, beforeCommit func() error) (storage.Inventory, error) {
	close(s.writing)
	<-s.proceed
	return s.Store.PlaceOrder(ctx, w, beforeCommit)
}

// TestRestockWaitsForTheHolder: a PUT sent while a seller holds the SKU's
// lock between its read and its write is not lost to that write: the PUT
// waits for the lock and lands after the sale.
func TestRestockWaitsForTheHolder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, guard := range []storage.Guard{storage.GuardNone, storage.GuardFencing} {
		t.Run(string(guard), func(t *testing.T) {
			sku := "rw-" + string(guard)
			f.stock(sku, 10)
			admin := f.redisReplicas(1, order.Config{Guard: guard, AdminToken: adminToken})[0]
			held := heldWrite{Store: f.openStore(), writing: make(chan struct{}), proceed: make(chan struct{})}
			locker, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer locker.Close()
			seller := f.serviceWith(held, nil, locker, order.Config{Instance: "seller", Lock: "redis", Guard: guard}).Handler()

			sale := make(chan *httptest.ResponseRecorder, 1)
			go func() { sale <- post(seller, sku, 1) }()
			select {
			case <-held.writing:
			case rec := <-sale:
				t.Fatalf("the sale never reached its write: %d %s", rec.Code, rec.Body)
			}
			put := make(chan *httptest.ResponseRecorder, 1)
			go func() {
				put <- call(admin, http.MethodPut, "/v1/inventory/"+sku, `{"stock":100}`, "Authorization", "Bearer "+adminToken)
			}()
			time.Sleep(200 * time.Millisecond) // the PUT reaches the lock and waits
			close(held.proceed)
			if rec := <-sale; rec.Code != http.StatusCreated {
				t.Errorf("sale: %d %s", rec.Code, rec.Body)
			}
			if rec := <-put; rec.Code != http.StatusOK {
				t.Errorf("PUT: %d %s", rec.Code, rec.Body)
			}
			if a := f.audit(sku); a.Stock != 100 || a.Orders != 1 {
				t.Errorf("audit %+v: want the PUT's 100 after the sale, not the sale's write over the PUT", a)
			}
		})
	}
}

// failingForce is a cache whose overwrite fails (a Redis blip during PUT).
type failingForce struct{ order.Cache }

func (failingForce) Force(context.Context, inventory.Item) error { return inventory.ErrDown }

// TestRestockCacheFailure: a reset committed in MySQL whose cache overwrite
// failed is answered 200 (it happened), and leaves no old entry for a guard
// that trusts the cached read: the next sale, on another replica, builds on
// the reset's stock, not on the entry from before it.
func TestRestockCacheFailure(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("rcf", 100)
	h := f.redisReplicas(1, order.Config{Guard: storage.GuardNone, AdminToken: adminToken})[0]
	if rec := post(h, "rcf", 1); rec.Code != http.StatusCreated { // the cache holds 99
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	locker, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	admin := f.serviceWith(f.openStore(), func(c order.Cache) order.Cache { return failingForce{c} }, locker,
		order.Config{Instance: "admin", Lock: "redis", Guard: storage.GuardNone, AdminToken: adminToken}).Handler()
	if rec := call(admin, http.MethodPut, "/v1/inventory/rcf", `{"stock":10}`, "Authorization", "Bearer "+adminToken); rec.Code != http.StatusOK {
		t.Fatalf("PUT with the cache overwrite failing: %d %s, want 200", rec.Code, rec.Body)
	}
	if rec := post(h, "rcf", 1); rec.Code != http.StatusCreated {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if a := f.audit("rcf"); a.Stock != 9 {
		t.Errorf("stock %d after the reset to 10 and one sale, want 9 (98 means the sale wrote over the reset)", a.Stock)
	}
}
