package order_test

import (
	"database/sql"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// TestOldBackendStragglerRefused is TestStaleBackendRefused (storage) on
// real ZooKeeper, Redis and MariaDB, under guard fencing: a zookeeper
// replica (zxid tokens) wrote the SKU, then froze past the liveness window
// (its row gone, as a lapsed one), and the fleet moved to redis (a counter
// from 1 per key).
// When the straggler comes back, its order, reset and hold are refused
// with 409 lock_lost, nothing written; the redis replica's orders, resets
// and holds pass before and after it tried. Before the fence epoch, the
// straggler's order passed the reset fence (201) and raised it to its zxid,
// above which every redis token of the SKU was 409 lock_lost until the
// counter caught up (for good against a real ensemble's zxids, >= 2^32).
func TestOldBackendStragglerRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	admin := []string{"Authorization", "Bearer " + adminToken}
	open := func(name string, bc backends.Config) order.Locker {
		t.Helper()
		bc.TTL = 5 * time.Second
		l, err := backends.Open(ctx, name, bc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	cfg := func(instance, lock string) order.Config {
		return order.Config{Instance: instance, Lock: lock, Guard: storage.GuardFencing, AdminToken: adminToken, LockWait: time.Minute}
	}

	old := f.service(open("zookeeper", backends.Config{ZKServers: testbed.ZooKeeper(t)}), cfg("zk1", "zookeeper"))
	if err := old.Start(ctx); err != nil {
		t.Fatal(err)
	}
	oh := old.Handler()
	wantCode(t, call(oh, http.MethodPut, "/v1/inventory/f3", `{"stock": 10}`, admin...), http.StatusOK, "")
	wantCode(t, post(oh, "f3", 1), http.StatusCreated, "")
	// Frozen past the liveness window: no heartbeat, its row lapsed. Its
	// handler, store and locker live on.
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	cur := f.service(open("redis", backends.Config{RedisAddr: f.redis}), cfg("rd1", "redis"))
	if err := cur.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cur.Close() })
	h := cur.Handler()

	straggle := func(when string) {
		t.Helper()
		before := getInv(t, h, "f3")
		t.Logf("%s: the straggler's order, reset and hold", when)
		wantCode(t, post(oh, "f3", 1), http.StatusConflict, "lock_lost")
		wantCode(t, call(oh, http.MethodPut, "/v1/inventory/f3", `{"stock": 99}`, admin...), http.StatusConflict, "lock_lost")
		wantCode(t, hold(oh, 60, "", "f3", 1), http.StatusConflict, "lock_lost")
		if after := getInv(t, h, "f3"); after != before {
			t.Errorf("%s: the straggler's refused writes changed the SKU: %+v, was %+v", when, after, before)
		}
	}
	straggle("before any write under redis")
	wantCode(t, post(h, "f3", 1), http.StatusCreated, "")
	wantCode(t, call(h, http.MethodPut, "/v1/inventory/f3", `{"stock": 20}`, admin...), http.StatusOK, "")
	wantCode(t, hold(h, 60, "", "f3", 1), http.StatusCreated, "")
	straggle("after redis wrote")
	wantCode(t, post(h, "f3", 1), http.StatusCreated, "")
	wantInv(t, h, "f3", 18, 1)
}

// TestEpochRefreshedAfterARoundTrip: a redis replica frozen while the
// fleet went to zookeeper and back to redis (a new epoch, the fences
// moved to it) takes the new epoch from its heartbeat and sells again;
// its own tokens are redis's, as the new epoch's are.
func TestEpochRefreshedAfterARoundTrip(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	l, err := backends.Open(ctx, "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	svc := f.service(l, order.Config{Instance: "rd1", Lock: "redis", Guard: storage.GuardFencing, AdminToken: adminToken, LockWait: time.Minute})
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	s := svc.Handler()
	wantCode(t, call(s, http.MethodPut, "/v1/inventory/rt", `{"stock": 10}`, "Authorization", "Bearer "+adminToken), http.StatusOK, "")
	id, err := locking.IdentityOf(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	// What the round trip leaves, in one step: redis's fences at epoch 2
	// (two adoptions one after the other could let the replica's heartbeat
	// read zookeeper's at epoch 1 between them, and withdraw).
	if epoch, _, err := f.store.ReclaimFences(ctx, storage.Fleet{Lock: "redis", LockID: id, Guard: "fencing"}, 2); err != nil || epoch != 2 {
		t.Fatalf("the fleet's round trip: epoch %d, %v", epoch, err)
	}
	start := time.Now()
	defer func() { t.Logf("sold again after %v", time.Since(start)) }()
	deadline := time.Now().Add(15 * time.Second)
	for rec := post(s, "rt", 1); rec.Code != http.StatusCreated; rec = post(s, "rt", 1) {
		if time.Now().After(deadline) {
			t.Fatalf("the replica of the epoch before: order %d %s 15 s after the round trip, want 201 once its heartbeat read the new epoch", rec.Code, rec.Body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestSupersededStragglerLeavesTheBalancer: a zookeeper replica frozen past
// the liveness window (its row lapsed, not removed, so
// it keeps its older started_at) while the fleet moved to redis comes back
// and heartbeats again. The redis replicas stay ready; the straggler
// itself is unready, naming the fences' backend. Before, its live row made every redis replica's /readyz 503
// ("live replica zk1 runs lock=zookeeper ...") and every redis Start
// ErrMixedSettings, while the straggler, whose writes the fences refuse,
// stayed ready: a whole-fleet outage for as long as it lived.
func TestSupersededStragglerLeavesTheBalancer(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	cfg := func(instance, lock string) order.Config {
		return order.Config{Instance: instance, Lock: lock, Guard: storage.GuardFencing, AdminToken: adminToken, LockWait: time.Minute}
	}
	straggler := f.service(local.New(), cfg("zk1", "zookeeper"))
	if err := straggler.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Frozen: no heartbeat, its row lapses (an hour old) but stays.
	if err := straggler.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "INSERT INTO replicas (instance, `lock`, guard, started_at, heartbeat_at) VALUES ('zk1', 'zookeeper', 'fencing', UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR)"); err != nil {
		t.Fatal(err)
	}

	l, err := backends.Open(ctx, "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	cur := f.service(l, cfg("rd1", "redis"))
	if err := cur.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cur.Close() })
	wantCode(t, call(cur.Handler(), http.MethodGet, "/readyz", ""), http.StatusOK, "")

	// The straggler wakes: its heartbeat makes its old row live again.
	if err := f.store.Heartbeat(ctx, storage.Replica{Instance: "zk1", Lock: "zookeeper", Guard: "fencing"}); err != nil {
		t.Fatal(err)
	}
	if rec := call(cur.Handler(), http.MethodGet, "/readyz", ""); rec.Code != http.StatusOK {
		t.Errorf("the redis replica once the superseded zookeeper straggler heartbeats: /readyz %d %s; want 200", rec.Code, rec.Body)
	}
	// A newcomer still waits for the straggler to go: at its start the
	// fences may name a lock a rival newcomer is about to replace.
	newcomer := f.service(l, cfg("rd2", "redis"))
	if err := newcomer.Start(ctx); !errors.Is(err, order.ErrMixedSettings) {
		t.Errorf("a redis newcomer beside the straggler: %v; want ErrMixedSettings", err)
		newcomer.Close()
	}
	rec := call(straggler.Handler(), http.MethodGet, "/readyz", "")
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "superseded") {
		t.Errorf("the straggler: /readyz %d %s; want 503 naming it superseded", rec.Code, rec.Body)
	}
}
