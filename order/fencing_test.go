package order_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
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

// TestFencingAfterCacheFailover is the chain that made guard fencing lose
// an update in the lab's redis-cluster-failover, on a real Redis Cluster:
// the SKU's cache entry lives on a master whose replication is cut, a sale
// deletes and rewrites the entry on that master only, the master dies and
// its replica, promoted, serves the entry from before the sale. The lock
// lives on another master, so the next holder's token is valid: the fence
// alone lets it sell the last unit again. The version check refuses it.
func TestFencingAfterCacheFailover(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const replUser, replPass = "repl", "fencing-test"
	c, err := testbed.StartRedisCluster(ctx, testbed.ClusterOptions{Args: []string{
		"--user", replUser, "on", ">" + replPass, "~*", "&*", "+@all",
		"--masteruser", replUser, "--masterauth", replPass,
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	addr := strings.Join(c.Addrs(), ",")

	// A SKU whose cache entry and lock are served by different masters.
	var sku string
	var cacheMaster int
	for i := 0; sku == ""; i++ {
		s := fmt.Sprintf("fo-%d", i)
		cm, err1 := masterOfKey(ctx, c, f.prefix+f.store.DatabaseIdentity()+":stock:"+s)
		lm, err2 := masterOfKey(ctx, c, "lock:{sku/"+s+"}")
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		if cm != lm {
			sku, cacheMaster = s, cm
		}
	}
	reps, err := c.ReplicasOf(ctx, cacheMaster)
	if err != nil || len(reps) != 1 {
		t.Fatalf("replicas of the cache's master: %v (%v)", reps, err)
	}
	rdb, err := redisconn.Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	locker, err := backends.Open(ctx, "redis", backends.Config{RedisAddr: addr, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	h := order.New(f.openStore(), inventory.New(rdb, f.prefix, f.store.DatabaseIdentity()), locker,
		order.Config{Instance: "r1", Lock: "redis", Guard: storage.GuardFencing}).Handler()
	f.stock(sku, 2)

	if rec := post(h, sku, 1); rec.Code != http.StatusCreated {
		t.Fatalf("first order: %d %s", rec.Code, rec.Body)
	}
	master := redis.NewClient(&redis.Options{Addr: c.Nodes[cacheMaster].Addr})
	defer master.Close()
	if n, err := master.Wait(ctx, 1, 2*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("the replica did not take the entry: %d (%v)", n, err)
	}
	// Replication cut by its user: the replica cannot log in again.
	for _, cmd := range [][]any{{"ACL", "SETUSER", replUser, "off"}, {"CLIENT", "KILL", "USER", replUser}} {
		if err := master.Do(ctx, cmd...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if rec := post(h, sku, 1); rec.Code != http.StatusCreated {
		t.Fatalf("second order: %d %s", rec.Code, rec.Body)
	}
	if err := c.Nodes[cacheMaster].Kill(); err != nil {
		t.Fatal(err)
	}
	for {
		if role, _ := c.Role(ctx, reps[0]); role == "master" {
			break
		}
		if err := clock.Sleep(ctx, 50*time.Millisecond); err != nil {
			t.Fatal("the replica was not promoted")
		}
	}

	// The third order, once the replica follows the failover (503 until
	// then: fencing needs the cache).
	var rec *httptest.ResponseRecorder
	for rec = post(h, sku, 1); rec.Code == http.StatusServiceUnavailable; rec = post(h, sku, 1) {
		if err := clock.Sleep(ctx, 100*time.Millisecond); err != nil {
			t.Fatalf("still 503 after the failover: %s", rec.Body)
		}
	}
	if rec.Code != http.StatusConflict || errorCode(t, rec) != "out_of_stock" {
		t.Errorf("order after the failover: %d %s, want 409 out_of_stock", rec.Code, rec.Body)
	}
	if a := f.audit(sku); a.Orders != 2 || a.Stock != 0 {
		t.Errorf("audit %+v: want 2 orders and stock 0 (stock 2 sold once)", a)
	}
}

// masterOfKey is the index of the node serving key's slot.
func masterOfKey(ctx context.Context, c *testbed.Cluster, key string) (int, error) {
	slot, err := c.KeySlot(ctx, key)
	if err != nil {
		return -1, err
	}
	return c.MasterOf(ctx, slot)
}
