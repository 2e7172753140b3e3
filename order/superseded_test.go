package order_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// withdrawWithin bounds a straggler's withdrawal: its next heartbeat
// (every 5 s) reads the fences, with room for a loaded machine.
const withdrawWithin = 20 * time.Second

// TestSupersededStragglerWithdraws: a zookeeper replica
// frozen past the liveness window while the fleet moved to redis comes
// back with its own heartbeat running. Its next heartbeat finds the fences
// at redis's later epoch: it removes its row, heartbeats no more, and
// stays unready, naming why. So a redis replica that restarts, and one
// added, start again. Before, the straggler heartbeated
// for its whole life and every redis Start meanwhile was ErrMixedSettings:
// crash restarts, rollouts and scale-ups failed, the fleet only shrank.
func TestSupersededStragglerWithdraws(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	db := f.rawDB(t)
	cfg := func(instance, lock string) order.Config {
		return order.Config{Instance: instance, Lock: lock, Guard: storage.GuardFencing, AdminToken: adminToken, LockWait: time.Minute}
	}
	straggler := f.service(local.New(), cfg("zk1", "zookeeper"))
	if err := straggler.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { straggler.Close() })
	cur := f.startWhileLapsed(db, "zk1", func() *order.Service { return f.redisReplica(cfg("rd1", "redis")) })

	// The straggler wakes: its row is live again (as its own heartbeat
	// makes it), older than rd1's, until it withdraws.
	reviveIfPresent(t, db, "zk1")
	wantCode(t, call(cur.Handler(), http.MethodGet, "/readyz", ""), http.StatusOK, "")
	wantSuperseded(t, f, straggler, "zk1", "the fences belong to lock=redis guard=fencing (epoch 1), this replica runs lock=zookeeper guard=fencing (epoch 0)")

	// rd1 crashes and restarts; rd2 is added.
	cur.Close()
	for _, name := range []string{"rd1", "rd2"} {
		s := f.redisReplica(cfg(name, "redis"))
		if err := s.Start(ctx); err != nil {
			t.Errorf("%s starting after the straggler withdrew: %v", name, err)
			continue
		}
		t.Cleanup(func() { s.Close() })
	}
	// Its heartbeat has stopped: a period later its row has not come back.
	time.Sleep(6 * time.Second)
	if names := live(t, f); names != "rd1 rd2" {
		t.Errorf("live replicas a heartbeat after the straggler withdrew: %q, want rd1 rd2", names)
	}
}

// TestGuardStragglerWithdraws: the fleet moves from guard
// version to guard fencing on the same lock (redis) while a version
// replica is frozen past the liveness window. When it comes back, older
// than every fencing replica, the fencing replicas stay ready and it is
// the unready one, superseded by the fences' guard, and withdraws. Before,
// the meta rows recorded no guard: the straggler was the older of a mixed
// pair, every fencing replica's /readyz was 503 and the straggler alone
// was ready, writing under the old guard (blind, had it been none).
func TestGuardStragglerWithdraws(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	straggler, cur := f.guardSwitch("v1", storage.GuardVersion)
	if rec := call(cur.Handler(), http.MethodGet, "/readyz", ""); rec.Code != http.StatusOK {
		t.Errorf("the fencing replica once the version straggler is live again: /readyz %d %s, want 200", rec.Code, rec.Body)
	}
	wantSuperseded(t, f, straggler, "v1", "the fences belong to lock=redis guard=fencing (epoch 1), this replica runs lock=redis guard=version (epoch 0)")
	more := f.redisReplica(order.Config{Instance: "f2", Guard: storage.GuardFencing, AdminToken: adminToken})
	if err := more.Start(t.Context()); err != nil {
		t.Errorf("a fencing replica starting after the straggler withdrew: %v", err)
	} else {
		more.Close()
	}
}

// TestLostAdoptionAdoptedAgain: the adoption of a switch
// to redis is lost (a failover to an asynchronous replica that had not
// applied it, or a restore): meta names etcd at epoch 0 again, the redis
// replica carries epoch 2 and has written fences at it. Its next heartbeat
// adopts the fences again at its own epoch (meta's + 1 would be 1, below
// its own fences: 409 lock_lost on its own SKU), it stays ready, sells,
// and is not superseded. Before, it was called superseded for good: /readyz
// 503 on every replica of the fleet, and nothing adopted again until one
// restarted.
func TestLostAdoptionAdoptedAgain(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	db := f.rawDB(t)
	for _, lock := range []string{"etcd", "zookeeper"} {
		if _, _, err := f.store.AdoptFences(ctx, storage.Fleet{Lock: lock, Guard: "fencing"}); err != nil {
			t.Fatal(err)
		}
	}
	s := f.redisReplica(order.Config{Instance: "rd1", Guard: storage.GuardFencing, AdminToken: adminToken})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	h := s.Handler()
	wantCode(t, call(h, http.MethodPut, "/v1/inventory/lost", `{"stock": 10}`, "Authorization", "Bearer "+adminToken), http.StatusOK, "")
	if inv, err := f.store.Inventory(ctx, "lost"); err != nil || inv.FenceEpoch != 2 {
		t.Fatalf("the SKU's fence after redis's reset: %+v, %v; want epoch 2", inv, err)
	}
	for _, q := range []string{"UPDATE meta SET value = 'etcd' WHERE name = 'fence_lock'", "UPDATE meta SET value = '0' WHERE name = 'fence_epoch'"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	lost := time.Now()
	deadline := lost.Add(withdrawWithin)
	for {
		fleet, epoch, err := f.store.Fences(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if fleet.Lock == "redis" {
			t.Logf("adopted again %v after the loss", time.Since(lost))
			if epoch != 2 {
				t.Errorf("adopted again at epoch %d, want 2 (its own)", epoch)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fences still name %+v at epoch %d %v after the adoption was lost", fleet, epoch, withdrawWithin)
		}
		time.Sleep(200 * time.Millisecond)
	}
	wantCode(t, call(h, http.MethodGet, "/readyz", ""), http.StatusOK, "")
	wantCode(t, post(h, "lost", 1), http.StatusCreated, "")
	if names := live(t, f); names != "rd1" {
		t.Errorf("live replicas after the adoption was lost and made again: %q, want rd1 (not withdrawn)", names)
	}
}

// startWhileLapsed starts a replica of newer settings while instance's row
// has lapsed (frozen past the liveness window; its heartbeat still runs
// and may revive the row just before the look: then the newcomer is
// refused, and tries again).
func (f *fixture) startWhileLapsed(db *sql.DB, instance string, newcomer func() *order.Service) *order.Service {
	f.t.Helper()
	for try := 0; ; try++ {
		if _, err := db.ExecContext(f.t.Context(), "UPDATE replicas SET heartbeat_at = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR WHERE instance = ?", instance); err != nil {
			f.t.Fatal(err)
		}
		s := newcomer()
		err := s.Start(f.t.Context())
		if err == nil {
			f.t.Cleanup(func() { s.Close() })
			return s
		}
		if !errors.Is(err, order.ErrMixedSettings) || try == 3 {
			f.t.Fatal(err)
		}
	}
}

// reviveIfPresent makes instance's row live, as the heartbeat of a
// replica that comes back does, unless it has withdrawn already (an
// upsert would bring back a row that withdrawal removed).
func reviveIfPresent(t *testing.T, db *sql.DB, instance string) {
	t.Helper()
	if _, err := db.ExecContext(t.Context(), "UPDATE replicas SET heartbeat_at = UTC_TIMESTAMP(6) WHERE instance = ?", instance); err != nil {
		t.Fatal(err)
	}
}

// wantSuperseded waits for s's row to go (it withdraws) and checks it is
// unready, naming why.
func wantSuperseded(t *testing.T, f *fixture, s *order.Service, instance, why string) {
	t.Helper()
	for deadline := time.Now().Add(withdrawWithin); strings.Contains(" "+live(t, f)+" ", " "+instance+" "); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the straggler %s has not withdrawn %v after the fleet moved on", instance, withdrawWithin)
		}
	}
	rec := call(s.Handler(), http.MethodGet, "/readyz", "")
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "superseded: "+why) {
		t.Errorf("the straggler: /readyz %d %s, want 503 naming it superseded: %s", rec.Code, rec.Body, why)
	}
}

// TestStragglerCannotCreateASKU: a zookeeper replica
// frozen while the fleet moved to redis (epoch 1) comes back and is asked
// to create a SKU (admin tools may address a replica directly): 409
// lock_lost, nothing created, so it has nothing of its own to sell on.
// Before, the PUT was 200 with the straggler's fence (0, token), and its
// orders on that SKU passed beside the fleet's until the fleet first wrote
// there.
func TestStragglerCannotCreateASKU(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	admin := []string{"Authorization", "Bearer " + adminToken}
	cfg := func(instance, lock string) order.Config {
		return order.Config{Instance: instance, Lock: lock, Guard: storage.GuardFencing, AdminToken: adminToken, LockWait: time.Minute}
	}
	old := f.service(local.New(), cfg("zk1", "zookeeper"))
	if err := old.Start(ctx); err != nil {
		t.Fatal(err)
	}
	oh := old.Handler()
	wantCode(t, call(oh, http.MethodPut, "/v1/inventory/warm", `{"stock": 10}`, admin...), http.StatusOK, "")
	if err := old.Close(); err != nil { // frozen: its row gone, its handler lives on
		t.Fatal(err)
	}
	cur := f.redisReplica(cfg("rd1", "redis"))
	if err := cur.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cur.Close() })
	h := cur.Handler()

	wantCode(t, call(oh, http.MethodPut, "/v1/inventory/fresh", `{"stock": 10}`, admin...), http.StatusConflict, "lock_lost")
	wantCode(t, call(h, http.MethodGet, "/v1/inventory/fresh", ""), http.StatusNotFound, "unknown_sku")
	wantCode(t, post(oh, "fresh", 1), http.StatusNotFound, "unknown_sku")
	wantCode(t, call(h, http.MethodPut, "/v1/inventory/fresh", `{"stock": 10}`, admin...), http.StatusOK, "")
	wantCode(t, post(oh, "fresh", 1), http.StatusConflict, "lock_lost")
	wantCode(t, post(h, "fresh", 1), http.StatusCreated, "")
	wantInv(t, h, "fresh", 9, 0)
}

// TestWithdrawnReplicaRefusesWrites: a replica of guard none, superseded
// by a switch to fencing, withdraws; a client that still addresses it
// directly gets 409 lock_lost for an order, a hold, a reset, a confirm and
// a cancel (the last two of the fleet's holds), and nothing changes.
// Before, its order under guard none was 201 (MySQL compares no fence under
// that guard) beside the fleet's.
func TestWithdrawnReplicaRefusesWrites(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	straggler, cur := f.guardSwitch("n1", storage.GuardNone)
	wantSuperseded(t, f, straggler, "n1", "the fences belong to lock=redis guard=fencing (epoch 1), this replica runs lock=redis guard=none (epoch 0)")

	admin := []string{"Authorization", "Bearer " + adminToken}
	if rec := call(cur.Handler(), http.MethodPut, "/v1/inventory/wd", `{"stock": 10}`, admin...); rec.Code != http.StatusOK {
		t.Fatalf("the fleet's PUT: %d %s", rec.Code, rec.Body)
	}
	toConfirm := decodeReservation(t, hold(cur.Handler(), 0, "wd-c", "wd", 1))
	toCancel := decodeReservation(t, hold(cur.Handler(), 0, "wd-x", "wd", 1))
	h := straggler.Handler()
	for name, rec := range map[string]*httptest.ResponseRecorder{
		"order":   post(h, "wd", 3, "Idempotency-Key", "wd-1"),
		"hold":    hold(h, 0, "wd-h", "wd", 2),
		"reset":   call(h, http.MethodPut, "/v1/inventory/wd", `{"stock": 99}`, admin...),
		"confirm": settle(h, toConfirm.ID, "confirm"),
		"cancel":  settle(h, toCancel.ID, "cancel"),
	} {
		if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), `"lock_lost"`) {
			t.Errorf("the withdrawn replica's %s: %d %s, want 409 lock_lost", name, rec.Code, rec.Body)
		}
	}
	if a := f.audit("wd"); a.Stock != 8 || a.Reserved != 2 || a.Orders != 0 {
		t.Errorf("audit %+v, want stock 8, reserved 2 (the fleet's holds) and no order: the withdrawn replica wrote", a)
	}
	if rec := post(cur.Handler(), "wd", 3, "Idempotency-Key", "wd-2"); rec.Code != http.StatusCreated {
		t.Errorf("the fleet's order after: %d %s, want 201", rec.Code, rec.Body)
	}
}

// guardSwitch starts a redis replica of guard old, lets its row lapse
// while a fencing replica f1 starts (a guard switch: epoch 1), then makes
// the straggler's row live again, as a replica back from a freeze would.
func (f *fixture) guardSwitch(instance string, old storage.Guard) (straggler, cur *order.Service) {
	f.t.Helper()
	db := f.rawDB(f.t)
	straggler = f.redisReplica(order.Config{Instance: instance, Guard: old, AdminToken: adminToken})
	if err := straggler.Start(f.t.Context()); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { straggler.Close() })
	cur = f.startWhileLapsed(db, instance, func() *order.Service {
		return f.redisReplica(order.Config{Instance: "f1", Guard: storage.GuardFencing, AdminToken: adminToken})
	})
	reviveIfPresent(f.t, db, instance)
	return straggler, cur
}

// TestWithdrawnReplicaStaysUnready: a replica withdrawn
// by a move to guard fencing stays unready when the fleet moves back to
// its settings (a rollback): it heartbeats no more and refuses every
// write, so a 200 would put a replica that answers only 409 back in the
// balancer. Before, its /readyz was 200 once the fences named its
// settings again, and its order 409 lock_lost.
func TestWithdrawnReplicaStaysUnready(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	straggler, cur := f.guardSwitch("v1", storage.GuardVersion)
	wantSuperseded(t, f, straggler, "v1", "the fences belong to lock=redis guard=fencing (epoch 1), this replica runs lock=redis guard=version (epoch 0)")
	if err := cur.Close(); err != nil {
		t.Fatal(err)
	}
	back := f.redisReplica(order.Config{Instance: "v2", Guard: storage.GuardVersion, AdminToken: adminToken})
	if err := back.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { back.Close() })
	if fleet, _, err := f.store.Fences(t.Context()); err != nil || fleet.Guard != string(storage.GuardVersion) {
		t.Fatalf("fences after the rollback: %+v, %v; want guard version", fleet, err)
	}
	rec := call(straggler.Handler(), http.MethodGet, "/readyz", "")
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "superseded") {
		t.Errorf("the withdrawn replica after the fleet came back to its settings: /readyz %d %s, want 503 naming it superseded", rec.Code, rec.Body)
	}
	wantCode(t, call(back.Handler(), http.MethodGet, "/readyz", ""), http.StatusOK, "")
}

// TestWithdrawalStopsAWriteInFlight: an order of a guard
// none replica that passed the entry check, holds the lock and has read,
// waits (the fault hook) while the fleet moves to fencing and the replica
// withdraws. Let go, it must not write: 409 lock_lost, no order, the stock
// as it was. Before, only the request's start looked, and the order was
// 201 beside the new fleet (guard none compares no fence).
func TestWithdrawalStopsAWriteInFlight(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := f.rawDB(t)
	entered, letGo := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func(_ context.Context, at order.HookPoint, h order.HookInfo) {
		if at == order.HookAfterRead && h.SKU == "inflight" {
			once.Do(func() { close(entered) })
			<-letGo
		}
	}
	straggler := f.redisReplica(order.Config{Instance: "n1", Guard: storage.GuardNone, AdminToken: adminToken, Observers: faultHook(hook)})
	if err := straggler.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { straggler.Close() })
	admin := []string{"Authorization", "Bearer " + adminToken}
	wantCode(t, call(straggler.Handler(), http.MethodPut, "/v1/inventory/inflight", `{"stock": 10}`, admin...), http.StatusOK, "")
	answer := make(chan *httptest.ResponseRecorder, 1)
	go func() { answer <- post(straggler.Handler(), "inflight", 1, "Idempotency-Key", "inflight-1") }()
	select {
	case <-entered:
	case <-time.After(withdrawWithin):
		t.Fatal("the order never reached the hook")
	}
	f.startWhileLapsed(db, "n1", func() *order.Service {
		return f.redisReplica(order.Config{Instance: "f1", Guard: storage.GuardFencing, AdminToken: adminToken})
	})
	reviveIfPresent(t, db, "n1")
	wantSuperseded(t, f, straggler, "n1", "the fences belong to lock=redis guard=fencing (epoch 1), this replica runs lock=redis guard=none (epoch 0)")
	close(letGo)
	rec := <-answer
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), `"lock_lost"`) {
		t.Errorf("the order let go after its replica withdrew: %d %s, want 409 lock_lost", rec.Code, rec.Body)
	}
	if a := f.audit("inflight"); a.Stock != 10 || a.Orders != 0 {
		t.Errorf("audit %+v, want stock 10 and no order: the withdrawn replica wrote", a)
	}
}
