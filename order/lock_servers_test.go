package order_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// TestNewLockServersGetANewEpoch, on real servers, guard
// fencing, one lock name throughout: the fleet's lock servers count their
// tokens past 30 for a SKU, and an order leaves a fence there. Restarted
// with their data, the servers keep the epoch (no needless new one) and
// the next replica sells above that fence. Then the fleet moves to servers
// whose tokens start again (a new etcd cluster, a new ZooKeeper server, the
// same Redis flushed, as a restart without persistence leaves it): the
// first replica on them raises the epoch, and its orders sell at once.
// Before, the name alone decided: no new epoch, every order on that SKU
// 409 lock_lost below the old fence. The move is made as a backend switch
// is: a replica on the new servers is refused at Start while one on the old
// servers lives, and starts once they are gone. A replica still on the old
// servers (or on the flushed Redis, with its identity from before) that
// answers after that is refused, 409 lock_lost, and unready.
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
			starting := func(instance, addr string) (*order.Service, locking.Locker, error) {
				t.Helper()
				bc := c.cfg(addr)
				bc.TTL = 5 * time.Second
				l, err := backends.Open(ctx, c.lock, bc)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
				svc := f.service(l, order.Config{Instance: instance, Lock: c.lock, Guard: storage.GuardFencing, AdminToken: adminToken, LockWait: time.Minute})
				t.Cleanup(func() { svc.Close() })
				return svc, l, svc.Start(ctx)
			}
			replica := func(instance, addr string) *order.Service {
				t.Helper()
				svc, l, err := starting(instance, addr)
				if err != nil {
					t.Fatalf("start %s: %v", instance, err)
				}
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
			if _, _, err := starting("b0", addr); !errors.Is(err, order.ErrMixedSettings) {
				t.Errorf("b0, on the new servers while a1 and a2 live on the old: start %v; want %v", err, order.ErrMixedSettings)
			}
			if e := epoch(); e != before {
				t.Errorf("after b0 was refused: epoch %d, was %d; want it kept", e, before)
			}
			// The old replicas stop (scaled to zero); a2 still answers
			// requests sent to it, as a straggler would.
			first.Close()
			again.Close()
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

// TestOldServersReplicaRefusedAtStart: a fleet has moved to other lock
// servers under the same name (identity B) and runs; a replica on the old
// servers (identity A, same lock name and guard) restarts, as a crashed pod
// of the old version of a rolling update would. Start refuses it,
// ErrMixedSettings, leaves no row, and the fences stay the fleet's: the
// fleet goes on selling. Before, the identity was not in the replicas
// table: the old replica started, took the fences back to A at a new
// epoch, and the fleet's orders were refused (409 lock_lost), its replicas
// superseded.
func TestOldServersReplicaRefusedAtStart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	fleet := f.redisReplica(order.Config{Instance: "b1", Guard: storage.GuardFencing, AdminToken: adminToken})
	if err := fleet.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	wantCode(t, call(fleet.Handler(), http.MethodPut, "/v1/inventory/old", `{"stock": 5}`, "Authorization", "Bearer "+adminToken), http.StatusOK, "")
	before, epoch, err := f.store.Fences(ctx)
	if err != nil {
		t.Fatal(err)
	}

	old, err := testbed.StartRedis(ctx, testbed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { old.Stop() })
	l, err := backends.Open(ctx, "redis", backends.Config{RedisAddr: old.Addr, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	straggler := f.service(l, order.Config{Instance: "a1", Lock: "redis", Guard: storage.GuardFencing, AdminToken: adminToken, LockWait: time.Minute})
	t.Cleanup(func() { straggler.Close() })
	err = straggler.Start(ctx)
	if !errors.Is(err, order.ErrMixedSettings) || !strings.Contains(fmt.Sprint(err), "other lock servers") {
		t.Errorf("a1, on the old servers, while b1 lives on the new: start %v; want %v naming other lock servers", err, order.ErrMixedSettings)
	}
	after, epochAfter, err := f.store.Fences(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after != before || epochAfter != epoch || after.LockID == "" {
		t.Errorf("fences after a1's start: %+v at epoch %d; want the fleet's %+v at epoch %d", after, epochAfter, before, epoch)
	}
	if names := live(t, f); names != "b1" {
		t.Errorf("live replicas %q; want b1 alone", names)
	}
	if rec := post(fleet.Handler(), "old", 1); rec.Code != http.StatusCreated {
		t.Errorf("b1's order after a1 was refused: %d %s; want 201", rec.Code, rec.Body)
	}
	if rec := call(fleet.Handler(), http.MethodGet, "/readyz", ""); rec.Code != http.StatusOK {
		t.Errorf("b1: /readyz %d %s; want 200", rec.Code, rec.Body)
	}
}
