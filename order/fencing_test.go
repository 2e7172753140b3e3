package order_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// TestFencingRefusesStaleEntry: a cache entry behind MySQL under a valid
// lease, as a Redis failover leaves it when the invalidation and the update
// of the last holder reached only the master that died. The next holder's
// token is newer than the row's fence, so the fence alone lets its write
// through: it would sell the last unit twice. The fenced write is also
// conditional on the row's version being the one read: it is refused, the
// entry is read again from MySQL under the same lock, and the order is
// answered out of stock.
func TestFencingRefusesStaleEntry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const sku = "fence-stale"
	f.stock(sku, 1)
	locker, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	h := f.service(locker, order.Config{Lock: "redis", Guard: storage.GuardFencing}).Handler()
	cache := f.cache()
	before, err := f.store.Inventory(t.Context(), sku)
	if err != nil {
		t.Fatal(err)
	}

	if rec := post(h, sku, 1); rec.Code != http.StatusCreated {
		t.Fatalf("first order: %d %s, want 201", rec.Code, rec.Body)
	}
	// The failover: the entry is back to the stock before the sale.
	stale := inventory.Item{SKU: sku, Stock: before.Stock, Version: before.Version}
	if err := cache.Force(t.Context(), stale); err != nil {
		t.Fatal(err)
	}
	if rec := post(h, sku, 1); rec.Code != http.StatusConflict || errorCode(t, rec) != "out_of_stock" {
		t.Errorf("order on a stale entry: %d %s, want 409 out_of_stock", rec.Code, rec.Body)
	}
	a := f.audit(sku)
	if a.Orders != 1 || a.Stock != 0 {
		t.Errorf("audit %+v: want one order and stock 0 (stock 1 sold once)", a)
	}
	miss := func(context.Context) (inventory.Item, error) { return inventory.Item{}, errors.New("no entry") }
	got, err := cache.Get(t.Context(), sku, miss)
	if err != nil || got.Stock != 0 || got.Version <= before.Version {
		t.Errorf("cache after the refusal: %+v (%v), want MySQL's stock 0 at a newer version than %d", got, err, before.Version)
	}
}
