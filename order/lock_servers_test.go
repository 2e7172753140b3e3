package order_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// TestNewLockServersGetANewEpoch is review-5 R5-3 on real servers, guard
// fencing, one lock name throughout: the fleet's lock servers count their
// tokens past 30 for a SKU, and an order leaves a fence there. Restarted
// with their data, the servers keep the epoch (no needless new one) and
// the next replica sells above that fence. Then the fleet moves to servers
// whose tokens start again (a new etcd cluster, a new ZooKeeper server, the
// same Redis flushed, as a restart without persistence leaves it): the
// first replica on them raises the epoch, and its orders sell at once.
// Before, the name alone decided: no new epoch, every order on that SKU
// 409 lock_lost below the old fence. A replica still on the old servers
// (or on the flushed Redis, with its identity from before) is refused,
// 409 lock_lost, and unready.
func TestNewLockServersGetANewEpoch(t *testing.T) {
	t.Parallel()
	persist := testbed.Options{Args: []string{"--appendonly", "yes", "--appendfsync", "always"}}
	for _, c := range []struct {
		lock  string
		start func(context.Context, testbed.Options) (*testbed.Server, error)
		opts  testbed.Options
		cfg   func(addr string) backends.Config
		// afresh returns the address of servers whose tokens start again.
		afresh func(t *testing.T, srv *testbed.Server) string
	}{
		{"redis", testbed.StartRedis, persist, func(a string) backends.Config { return backends.Config{RedisAddr: a} },
			func(t *testing.T, srv *testbed.Server) string {
				c, err := redisconn.Open(srv.Addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if err := c.FlushAll(t.Context()).Err(); err != nil {
					t.Fatal(err)
				}
				return srv.Addr
			}},
		{"etcd", testbed.StartEtcd, testbed.Options{}, func(a string) backends.Config { return backends.Config{EtcdEndpoints: []string{a}} }, nil},
		{"zookeeper", testbed.StartZooKeeper, testbed.Options{}, func(a string) backends.Config { return backends.Config{ZKServers: []string{a}} }, nil},
	} {
		t.Run(c.lock, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			ctx := t.Context()
			server := func() *testbed.Server {
				srv, err := c.start(ctx, c.opts)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { srv.Stop() })
				return srv
			}
			replica := func(instance, addr string) *order.Service {
				t.Helper()
				bc := c.cfg(addr)
				bc.TTL = 5 * time.Second
				l, err := backends.Open(ctx, c.lock, bc)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
				svc := f.service(l, order.Config{Instance: instance, Lock: c.lock, Guard: storage.GuardFencing, AdminToken: adminToken, LockWait: time.Minute})
				if err := svc.Start(ctx); err != nil {
					t.Fatalf("start %s: %v", instance, err)
				}
				t.Cleanup(func() { svc.Close() })
				// Its tokens for the SKU past 30, as a busy fleet's are.
				for range 30 {
					lease, err := l.Acquire(ctx, "sku/ns")
					if err != nil {
						t.Fatal(err)
					}
					if err := lease.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				return svc
			}
			sell := func(who string, svc *order.Service, status int, code string) {
				t.Helper()
				key := []string{"Idempotency-Key", strings.ReplaceAll(who, " ", "-")}
				rec := post(svc.Handler(), "ns", 1, key...)
				// A lock server just restarted or started may refuse a
				// request for a moment (503 unavailable): not what this
				// test is about, so it tries again (the same order, by its
				// key), and says so.
				for try := 1; rec.Code == http.StatusServiceUnavailable && try < 4; try++ {
					t.Logf("%s: order %d %s; trying again", who, rec.Code, strings.TrimSpace(rec.Body.String()))
					time.Sleep(time.Second)
					rec = post(svc.Handler(), "ns", 1, key...)
				}
				if rec.Code != status || code != "" && errorCode(t, rec) != code {
					inv, err := f.store.Inventory(ctx, "ns")
					t.Errorf("%s: order %d %s; want %d %s (the SKU's fence (%d, %d), %v)",
						who, rec.Code, strings.TrimSpace(rec.Body.String()), status, code, inv.FenceEpoch, inv.Fence, err)
				}
			}
			epoch := func() uint64 {
				t.Helper()
				_, e, err := f.store.Fences(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return e
			}

			srv := server()
			first := replica("a1", srv.Addr)
			wantCode(t, call(first.Handler(), http.MethodPut, "/v1/inventory/ns", `{"stock": 10}`, "Authorization", "Bearer "+adminToken), http.StatusOK, "")
			sell("a1", first, http.StatusCreated, "")
			before := epoch()

			if err := srv.Kill(); err != nil {
				t.Fatal(err)
			}
			if err := srv.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			again := replica("a2", srv.Addr)
			if e := epoch(); e != before {
				t.Errorf("the same %s restarted with its data: epoch %d, was %d; want it kept", c.lock, e, before)
			}
			sell("a2, the same servers restarted", again, http.StatusCreated, "")

			addr := ""
			if c.afresh != nil {
				addr = c.afresh(t, srv)
			} else {
				addr = server().Addr
			}
			moved := replica("b1", addr)
			if e := epoch(); e != before+1 {
				t.Errorf("servers of %s whose tokens start again: epoch %d, was %d; want a new one", c.lock, e, before)
			}
			sell("b1, on servers whose tokens start again", moved, http.StatusCreated, "")
			sell("a2, the old servers' replica", again, http.StatusConflict, "lock_lost")
			if rec := call(again.Handler(), http.MethodGet, "/readyz", ""); rec.Code != http.StatusServiceUnavailable {
				t.Errorf("a2, the old servers' replica: /readyz %d %s; want 503, superseded", rec.Code, rec.Body)
			}
			if rec := call(moved.Handler(), http.MethodGet, "/readyz", ""); rec.Code != http.StatusOK {
				t.Errorf("b1: /readyz %d %s; want 200", rec.Code, rec.Body)
			}
			wantInv(t, moved.Handler(), "ns", 7, 0)
		})
	}
}
