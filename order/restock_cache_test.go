package order_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// cutAfterPut cuts the cache's Redis (a proxy) once a reset has committed
// in MySQL, before the service overwrites the cache entry.
type cutAfterPut struct {
	order.Store
	redis *testbed.Proxy
}

func (s cutAfterPut) PutInventory(ctx context.Context, p storage.Put) (storage.Inventory, error) {
	inv, err := s.Store.PutInventory(ctx, p)
	if err == nil {
		if cerr := s.redis.Cut(); cerr != nil {
			return inv, cerr
		}
	}
	return inv, err
}

// TestRestockCommittedCacheDown: the cache's Redis stops answering between
// a PUT's commit and its overwrite of the cache entry (a Redis call timing
// out under load, as in CI). The reset happened: the PUT is 200, not a 503
// that an admin counts as not done. The entry left behind (the stock
// before the reset, read by an order) does not outlive it: the next order
// sells from the reset's stock.
func TestRestockCommittedCacheDown(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, guard := range []storage.Guard{storage.GuardVersion, storage.GuardAtomic, storage.GuardNone} {
		t.Run(string(guard), func(t *testing.T) {
			sku := "cut-" + string(guard)
			f.stock(sku, 5)
			proxy, err := testbed.StartProxy("redis-"+string(guard), f.redis)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(proxy.Close)
			rdb, err := redisconn.Open(proxy.Addr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rdb.Close() })
			cache := inventory.New(rdb, f.prefix, f.store.DatabaseIdentity())
			svc := order.New(cutAfterPut{f.openStore(), proxy}, cache, nil,
				order.Config{Instance: "r1", Guard: guard, AdminToken: adminToken})
			h := svc.Handler()
			if rec := post(h, sku, 1); rec.Code != http.StatusCreated { // caches stock 4
				t.Fatalf("order before the reset: %d %s", rec.Code, rec.Body)
			}

			rec := call(h, http.MethodPut, "/v1/inventory/"+sku, `{"stock":100}`, "Authorization", "Bearer "+adminToken)
			var got struct{ Stock int64 }
			if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &got) != nil || got.Stock != 100 {
				t.Fatalf("PUT committed, cache cut: %d %s, want 200 with stock 100", rec.Code, rec.Body)
			}
			if a := f.audit(sku); a.Stock != 100 {
				t.Fatalf("stock in MySQL %d, want the reset's 100", a.Stock)
			}

			proxy.Restore()
			time.Sleep(1100 * time.Millisecond) // the cache's breaker closes
			if rec := post(h, sku, 1); rec.Code != http.StatusCreated {
				t.Fatalf("order after the reset: %d %s", rec.Code, rec.Body)
			}
			if a := f.audit(sku); a.Stock != 99 || a.Ordered != 2 {
				t.Errorf("stock %d, %d ordered; want 99 (the reset's 100 - 1), 2", a.Stock, a.Ordered)
			}
		})
	}
}
