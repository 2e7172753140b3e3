package order_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// TestMixedSettings: a replica that finds live replicas of its database
// with another lock or guard is the newcomer: it refuses to start, naming
// them, and leaves no row; the replicas serving stay ready. A newcomer that
// slipped past that (its row written without Start, as a replica whose
// heartbeats had lapsed and came back) is unready and does not make the
// older ones unready.
func TestMixedSettings(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	same := order.Config{Lock: "local", Guard: storage.GuardVersion}
	var serving []*order.Service
	for _, name := range []string{"ra", "rc"} {
		cfg := same
		cfg.Instance = name
		s := f.service(local.New(), cfg)
		if err := s.Start(ctx); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Cleanup(func() { s.Close() })
		serving = append(serving, s)
	}

	b := f.service(nil, order.Config{Instance: "rb", Guard: storage.GuardNone})
	err := b.Start(ctx)
	for _, want := range []string{
		"live replica ra runs lock=local guard=version, this one lock=none guard=none",
		"live replica rc runs lock=local guard=version, this one lock=none guard=none",
	} {
		if !errors.Is(err, order.ErrMixedSettings) || !strings.Contains(err.Error(), want) {
			t.Errorf("start of rb = %v, want ErrMixedSettings naming %q", err, want)
		}
	}
	if names := live(t, f); names != "ra rc" {
		t.Errorf("live replicas after rb refused: %q, want ra rc", names)
	}
	ready := func(s *order.Service) (int, string) {
		rec := call(s.Handler(), http.MethodGet, "/readyz", "")
		return rec.Code, rec.Body.String()
	}
	for _, s := range serving {
		if code, body := ready(s); code != 200 {
			t.Errorf("readyz of a serving replica after rb was refused = %d %s, want 200", code, body)
		}
	}

	// rb's row without Start: the later replica of the mixed pair.
	if err := f.store.Heartbeat(ctx, storage.Replica{Instance: "rb", Lock: "none", Guard: "none"}); err != nil {
		t.Fatal(err)
	}
	for _, s := range serving {
		if code, body := ready(s); code != 200 {
			t.Errorf("readyz of an older replica with rb live = %d %s, want 200", code, body)
		}
	}
	if code, body := ready(b); code != 503 || !strings.Contains(body, "live replica ra runs lock=local guard=version") {
		t.Errorf("readyz of rb = %d %s, want 503 naming ra", code, body)
	}
}

// TestMixedNewcomersAtOnce: two replicas with other settings that start at
// once on an empty table never both start (each announces itself before it
// looks, so the later look sees the other).
func TestMixedNewcomersAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for round := range 20 {
		x := f.service(local.New(), order.Config{Instance: "x", Lock: "local", Guard: storage.GuardVersion})
		y := f.service(nil, order.Config{Instance: "y", Guard: storage.GuardAtomic})
		start := make(chan struct{})
		var errX, errY error
		var wg sync.WaitGroup
		wg.Go(func() { <-start; errX = x.Start(t.Context()) })
		wg.Go(func() { <-start; errY = y.Start(t.Context()) })
		close(start)
		wg.Wait()
		if errX == nil && errY == nil {
			t.Fatalf("round %d: both started, with lock=local guard=version and lock=none guard=atomic", round)
		}
		for _, err := range []error{errX, errY} {
			if err != nil && !errors.Is(err, order.ErrMixedSettings) {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		x.Close()
		y.Close()
		if names := live(t, f); names != "" {
			t.Fatalf("round %d: rows left after both closed: %q", round, names)
		}
	}
}

// live names the live replicas of f's database, in order.
func live(t *testing.T, f *fixture) string {
	t.Helper()
	rs, err := f.store.LiveReplicas(t.Context(), 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rs {
		names = append(names, r.Instance)
	}
	return strings.Join(names, " ")
}

// TestLockSwitchResetsFences: the fleet moves from zookeeper (czxid tokens,
// at least 2^32) to redis (a counter from 1 per key), the documented way:
// the old replicas stopped first. The first redis replica's Start resets
// the fences, so fenced orders and admin resets work at once; a replica of
// the same backend resets nothing. Under guard version a reset never reads
// the fence at all.
func TestLockSwitchResetsFences(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	if _, _, err := f.store.AdoptFences(ctx, storage.Fleet{Lock: "zookeeper", Guard: "fencing"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.PutInventory(ctx, storage.Put{SKU: "switch", Stock: 10, Token: 1 << 33}); err != nil {
		t.Fatal(err)
	}
	version := f.redisReplicas(1, order.Config{Guard: storage.GuardVersion, AdminToken: adminToken})[0]
	if rec := call(version, http.MethodPut, "/v1/inventory/switch", `{"stock": 10}`, "Authorization", "Bearer "+adminToken); rec.Code != http.StatusOK {
		t.Errorf("guard version, fence of another backend: PUT %d %s, want 200", rec.Code, rec.Body)
	}

	locker, err := backends.Open(ctx, "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Close() })
	s := f.service(locker, order.Config{Instance: "rf", Lock: "redis", Guard: storage.GuardFencing, AdminToken: adminToken, LockWait: time.Minute})
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	h := s.Handler()
	if rec := post(h, "switch", 1); rec.Code != http.StatusCreated {
		t.Errorf("guard fencing after the switch: order %d %s, want 201", rec.Code, rec.Body)
	}
	if rec := call(h, http.MethodPut, "/v1/inventory/switch", `{"stock": 20}`, "Authorization", "Bearer "+adminToken); rec.Code != http.StatusOK {
		t.Errorf("guard fencing after the switch: PUT %d %s, want 200", rec.Code, rec.Body)
	}
	// A second replica: its own Locker on the same Redis.
	other, err := backends.Open(ctx, "redis", backends.Config{RedisAddr: f.redis})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	id, err := locking.IdentityOf(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	if _, reset, err := f.store.AdoptFences(ctx, storage.Fleet{Lock: "redis", LockID: id, Guard: "fencing"}); err != nil || reset {
		t.Errorf("a second redis replica: reset %v, err %v; want no reset", reset, err)
	}
}

// TestFailedAdoptionLeavesNoRow: a Start whose adoption of the fences
// fails (here its ctx ends while another session holds meta's rows) takes
// its announcement back, as a refused newcomer does: a row left behind
// would count as a live replica for 15 s and refuse newcomers with other
// settings.
func TestFailedAdoptionLeavesNoRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	first := f.redisReplica(order.Config{Instance: "a1", Guard: storage.GuardVersion})
	if err := first.Start(t.Context()); err != nil { // meta's rows exist from here
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second := f.redisReplica(order.Config{Instance: "a2", Guard: storage.GuardVersion}) // migrates meta
	t.Cleanup(func() { second.Close() })
	db, err := sql.Open("mysql", f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(t.Context(), "SELECT * FROM meta FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	err = second.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), "adopt fences") {
		t.Fatalf("start while meta is locked: %v; want the adoption's failure", err)
	}
	if names := live(t, f); names != "" {
		t.Errorf("live replicas %q after a failed start; want none", names)
	}
}

// TestMixedIntake: replicas that agree on lock and guard but not on the
// gate or on when an order is answered are mixed settings too: a newcomer
// of another gate or accept is refused, naming both.
func TestMixedIntake(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	for _, c := range []struct {
		peer storage.Replica
		want string
	}{
		{storage.Replica{Instance: "q1", Lock: "none", Guard: "atomic", Gate: "redis", Accept: "queue"},
			"live replica q1 runs lock=none guard=atomic gate=redis accept=queue, this one lock=none guard=atomic gate=none accept=sync"},
		{storage.Replica{Instance: "q2", Lock: "none", Guard: "atomic", Gate: "redis", Accept: "sync"},
			"live replica q2 runs lock=none guard=atomic gate=redis accept=sync, this one lock=none guard=atomic gate=none accept=sync"},
	} {
		if err := f.store.Heartbeat(ctx, c.peer); err != nil {
			t.Fatal(err)
		}
		s := f.service(nil, order.Config{Instance: "newcomer", Guard: storage.GuardAtomic})
		if err := s.Start(ctx); !errors.Is(err, order.ErrMixedSettings) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("start with %+v live = %v, want ErrMixedSettings naming %q", c.peer, err, c.want)
		}
		s.Close()
		if err := f.store.RemoveReplica(ctx, c.peer.Instance); err != nil {
			t.Fatal(err)
		}
	}
	// A gated newcomer records the keys it takes for: a gated replica of a
	// version that does not ("redis"), or one older than the gate (no gate
	// recorded: it takes from no gate), commits keyed orders the key set
	// never learns of.
	for _, c := range []struct {
		peer storage.Replica
		want string
	}{
		{storage.Replica{Instance: "g1", Lock: "none", Guard: "atomic", Gate: "redis", Accept: "sync"},
			"live replica g1 runs lock=none guard=atomic gate=redis accept=sync, this one lock=none guard=atomic gate=redis+keys accept=sync"},
		{storage.Replica{Instance: "g2", Lock: "none", Guard: "atomic"},
			"live replica g2 runs lock=none guard=atomic gate=none accept=sync, this one lock=none guard=atomic gate=redis+keys accept=sync"},
	} {
		if err := f.store.Heartbeat(ctx, c.peer); err != nil {
			t.Fatal(err)
		}
		s := f.service(nil, order.Config{Instance: "newcomer", Guard: storage.GuardAtomic, Gate: f.gate()})
		if err := s.Start(ctx); !errors.Is(err, order.ErrMixedSettings) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("gated start with %+v live = %v, want ErrMixedSettings naming %q", c.peer, err, c.want)
		}
		s.Close()
		if err := f.store.RemoveReplica(ctx, c.peer.Instance); err != nil {
			t.Fatal(err)
		}
	}
	// An older version's row (no gate, no accept recorded) beside an
	// ungated newcomer is not mixed: it takes from no gate either.
	if err := f.store.Heartbeat(ctx, storage.Replica{Instance: "old", Lock: "none", Guard: "atomic"}); err != nil {
		t.Fatal(err)
	}
	s := f.service(nil, order.Config{Instance: "newcomer", Guard: storage.GuardAtomic})
	if err := s.Start(ctx); err != nil {
		t.Errorf("start beside an older version's row: %v", err)
	}
	s.Close()
}
