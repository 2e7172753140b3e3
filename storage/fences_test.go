package storage_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oversold-lab/oversold/storage"
)

// TestAdoptFences: the fences (a SKU's, and the fences table's) move to a
// new epoch when the fleet moves to another backend, to other servers
// of the same one (another identity: a new ensemble whose zxids start
// below the old one's), or to another guard, and only then; a backend that
// comes back gets a new epoch again, so its sweeper passes with a counter
// that started again from 1. A database that recorded only the name (before
// identities) adopts the identity without a new epoch. Fences reads what
// was adopted.
func TestAdoptFences(t *testing.T) {
	s, db := openStoreAndDB(t)
	ctx := t.Context()
	if _, err := s.PutInventory(ctx, storage.Put{SKU: "af", Stock: 5, Token: 1 << 33}); err != nil {
		t.Fatal(err)
	}
	put(t, s, "af-swept", 5)
	first, again := hold(t, s, "af-swept", 0), hold(t, s, "af-swept", 0)
	waitDue(t, s, again)
	if _, _, err := sweep(ctx, s, first, 0, 1<<33); err != nil {
		t.Fatal(err)
	}
	fence := func() (epoch, token uint64) {
		t.Helper()
		inv, err := s.Inventory(ctx, "af")
		if err != nil {
			t.Fatal(err)
		}
		return inv.FenceEpoch, inv.Fence
	}
	fleet := func(lock, id, guard string) storage.Fleet { return storage.Fleet{Lock: lock, LockID: id, Guard: guard} }
	for _, step := range []struct {
		fleet            storage.Fleet
		epoch            uint64
		reset            bool
		wantEpoch, token uint64
	}{
		{fleet("zookeeper", "A", "fencing"), 0, false, 0, 1 << 33}, // first record: adopted as it stands
		{fleet("zookeeper", "A", "fencing"), 0, false, 0, 1 << 33}, // the same ensemble (restarted or not)
		{fleet("zookeeper", "B", "fencing"), 1, true, 1, 0},        // a new ensemble under the same name
		{fleet("zookeeper", "B", "fencing"), 1, false, 1, 0},
		{fleet("redis", "R", "fencing"), 2, true, 2, 0},
		{fleet("redis", "R", "fencing"), 2, false, 2, 0},
		{fleet("redis", "", "fencing"), 3, true, 3, 0}, // (a name alone is an identity too)
		{fleet("redis", "", "version"), 4, true, 4, 0}, // a guard switch
		{fleet("zookeeper", "B", "fencing"), 5, true, 5, 0},
	} {
		epoch, reset, err := s.AdoptFences(ctx, step.fleet)
		if err != nil {
			t.Fatal(err)
		}
		e, tok := fence()
		if epoch != step.epoch || reset != step.reset || e != step.wantEpoch || tok != step.token {
			t.Errorf("AdoptFences(%+v): epoch %d, reset %v, fence (%d, %d); want %d, %v, (%d, %d)",
				step.fleet, epoch, reset, e, tok, step.epoch, step.reset, step.wantEpoch, step.token)
		}
		if got, e, err := s.Fences(ctx); err != nil || got != step.fleet || e != step.epoch {
			t.Errorf("Fences after adopting %+v: %+v, %d, %v; want epoch %d", step.fleet, got, e, err, step.epoch)
		}
	}
	if _, _, err := sweep(ctx, s, again, 5, 1); err != nil {
		t.Errorf("zookeeper's sweeper back at epoch 5, its counter from 1 again: %v", err)
	}
	// A database of a version that recorded the name only.
	if _, err := db.ExecContext(ctx, "DELETE FROM meta WHERE name IN ('fence_lock_id', 'fleet_guard')"); err != nil {
		t.Fatal(err)
	}
	if epoch, reset, err := s.AdoptFences(ctx, fleet("zookeeper", "C", "fencing")); err != nil || reset || epoch != 5 {
		t.Errorf("AdoptFences(zookeeper, C) over a record of the name alone: epoch %d, reset %v, %v; want 5, false", epoch, reset, err)
	}
	if epoch, reset, err := s.AdoptFences(ctx, fleet("zookeeper", "D", "fencing")); err != nil || !reset || epoch != 6 {
		t.Errorf("AdoptFences(zookeeper, D) after C: epoch %d, reset %v, %v; want 6, true", epoch, reset, err)
	}
}

// TestStragglerSweeperWithoutARow: the fleet leaves
// zookeeper before any zookeeper sweeper expired anything, so no sweeper
// fence row exists when the epoch moves. A straggler sweeper of zookeeper
// (old epoch, any token) is still refused, writing nothing, and the new
// backend's sweeper passes from token 1. With one row per backend and an
// adoption that moves only existing rows, the straggler created its own
// row and passed; with one row that the adoption does not create, it
// created that row and passed.
func TestStragglerSweeperWithoutARow(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	ctx := t.Context()
	old, _, err := s.AdoptFences(ctx, storage.Fleet{Lock: "zookeeper", Guard: "fencing"})
	if err != nil {
		t.Fatal(err)
	}
	put(t, s, "r52", 10)
	late, cur := hold(t, s, "r52", 0), hold(t, s, "r52", 0)
	waitDue(t, s, cur)
	epoch, reset, err := s.AdoptFences(ctx, storage.Fleet{Lock: "redis", Guard: "fencing"})
	if err != nil || !reset || epoch == old {
		t.Fatalf("AdoptFences(redis): epoch %d (old %d), reset %v, %v", epoch, old, reset, err)
	}
	if _, _, err := sweep(ctx, s, late, old, 99); !errors.Is(err, storage.ErrStaleSweeper) {
		t.Errorf("the straggler's sweeper at (%d, 99) after the switch to epoch %d: %v, want %v", old, epoch, err, storage.ErrStaleSweeper)
	}
	if r, err := s.Reservation(ctx, late); err != nil || r.Status != storage.StatusHeld {
		t.Errorf("after the refused expiry the reservation is %q (%v), want held", r.Status, err)
	}
	if _, _, err := sweep(ctx, s, cur, epoch, 1); err != nil {
		t.Errorf("the new backend's sweeper at (%d, 1): %v", epoch, err)
	}
}

// TestReclaimFences, in the store: meta that lost
// adoptions (a failover to an asynchronous replica, a restore) goes back
// to the fleet that holds the fences, never below the epoch that fleet's
// replica carries (its own fences would refuse it), and above meta's if
// meta names another fleet; meta that names another fleet at an epoch
// above it superseded it, and nothing changes.
func TestReclaimFences(t *testing.T) {
	t.Parallel()
	s, db := openStoreAndDB(t)
	ctx := t.Context()
	redis, etcd := storage.Fleet{Lock: "redis", Guard: "fencing"}, storage.Fleet{Lock: "etcd", Guard: "fencing"}
	if _, _, err := s.AdoptFences(ctx, storage.Fleet{Lock: "zookeeper", Guard: "fencing"}); err != nil {
		t.Fatal(err)
	}
	for _, sku := range []string{"lost", "mine"} {
		if _, err := s.PutInventory(ctx, storage.Put{SKU: sku, Stock: 5, Token: 1 << 33}); err != nil {
			t.Fatal(err)
		}
	}
	// meta as the failover or restore left it (the fences the replica
	// wrote survived or not: both are seen, "mine" at its epoch).
	lose := func(fleet storage.Fleet, epoch, mine uint64) {
		t.Helper()
		for _, q := range []string{
			fmt.Sprintf("UPDATE meta SET value = '%s' WHERE name = 'fence_lock'", fleet.Lock),
			fmt.Sprintf("UPDATE meta SET value = '%s' WHERE name = 'fleet_guard'", fleet.Guard),
			fmt.Sprintf("UPDATE meta SET value = '%d' WHERE name = 'fence_epoch'", epoch),
			"UPDATE inventory SET fence_epoch = 0, fence = 1 << 33 WHERE sku = 'lost'",
			fmt.Sprintf("UPDATE inventory SET fence_epoch = %d, fence = 7 WHERE sku = 'mine'", mine),
		} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	fence := func(sku string) [2]uint64 {
		t.Helper()
		inv, err := s.Inventory(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		return [2]uint64{inv.FenceEpoch, inv.Fence}
	}
	for _, c := range []struct {
		name       string
		meta       storage.Fleet
		metaEpoch  uint64
		held       uint64
		epoch      uint64
		superseded bool
		lost, mine [2]uint64
		wantMeta   storage.Fleet
	}{
		{"another fleet below", storage.Fleet{Lock: "zookeeper", Guard: "fencing"}, 0, 2, 2, false, [2]uint64{2, 0}, [2]uint64{2, 7}, redis},
		{"another fleet at its epoch", etcd, 2, 2, 3, false, [2]uint64{3, 0}, [2]uint64{3, 0}, redis},
		{"its own fleet below", redis, 1, 3, 3, false, [2]uint64{3, 0}, [2]uint64{3, 7}, redis},
		{"its own fleet at its epoch", redis, 3, 3, 3, false, [2]uint64{0, 1 << 33}, [2]uint64{3, 7}, redis},
		{"its own fleet above", redis, 4, 3, 4, false, [2]uint64{0, 1 << 33}, [2]uint64{3, 7}, redis},
		{"another fleet above", etcd, 4, 3, 4, true, [2]uint64{0, 1 << 33}, [2]uint64{3, 7}, etcd},
	} {
		lose(c.meta, c.metaEpoch, c.held)
		epoch, superseded, err := s.ReclaimFences(ctx, redis, c.held)
		if err != nil {
			t.Fatal(err)
		}
		fleet, metaEpoch, err := s.Fences(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprintf("epoch %d, superseded %v, meta %+v at %d, fences %v and %v", epoch, superseded, fleet, metaEpoch, fence("lost"), fence("mine"))
		want := fmt.Sprintf("epoch %d, superseded %v, meta %+v at %d, fences %v and %v", c.epoch, c.superseded, c.wantMeta, c.epoch, c.lost, c.mine)
		if got != want {
			t.Errorf("%s (meta %+v at %d, held %d): %s; want %s", c.name, c.meta, c.metaEpoch, c.held, got, want)
		}
	}
}

// TestStaleBackendRefused: after the fleet moved from
// zookeeper to redis, a zookeeper replica that was frozen past the
// liveness window writes with its old epoch and a token far above any
// fence (a czxid). Every fenced write of it (order, reset, hold, sweeper
// expiry) is refused, changing nothing, and so is its creation of a SKU;
// and the new backend's first
// tokens (1, 2) pass on every row, before and after the straggler tried.
func TestStaleBackendRefused(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	ctx := t.Context()
	const czxid, stale = 1 << 33, 1 << 40
	old, _, err := s.AdoptFences(ctx, storage.Fleet{Lock: "zookeeper", Guard: "fencing"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutInventory(ctx, storage.Put{SKU: "f3", Stock: 10, Epoch: old, Token: czxid}); err != nil {
		t.Fatal(err)
	}
	// Due reservations of another SKU (atomic guard) for the sweepers;
	// the old backend's sweeper expired one: its fences row exists.
	put(t, s, "f3-swept", 10)
	due, a, b := hold(t, s, "f3-swept", 0), hold(t, s, "f3-swept", 0), hold(t, s, "f3-swept", 0)
	waitDue(t, s, b)
	if _, _, err := sweep(ctx, s, due, old, czxid+1); err != nil {
		t.Fatalf("the old backend's sweeper before the switch: %v", err)
	}
	cur, reset, err := s.AdoptFences(ctx, storage.Fleet{Lock: "redis", Guard: "fencing"})
	if err != nil || !reset || cur == old {
		t.Fatalf("AdoptFences(redis): epoch %d (old %d), reset %v, %v", cur, old, reset, err)
	}

	// due: a reservation due and held, for the straggler's sweeper.
	straggle := func(when, due string) {
		t.Helper()
		before, err := s.Inventory(ctx, "f3")
		if err != nil {
			t.Fatal(err)
		}
		w := storage.Write{Guard: storage.GuardFencing, Orders: []storage.Order{newOrder("f3", 1, "")},
			Stock: before.Stock, Version: before.Version, Epoch: old, Token: stale}
		if _, err := s.PlaceOrder(ctx, w, nil); !errors.Is(err, storage.ErrStaleFence) {
			t.Errorf("%s: the straggler's order: %v, want %v", when, err, storage.ErrStaleFence)
		}
		if _, err := s.PutInventory(ctx, storage.Put{SKU: "f3", Stock: 99, Epoch: old, Token: stale}); !errors.Is(err, storage.ErrStaleFence) {
			t.Errorf("%s: the straggler's reset: %v, want %v", when, err, storage.ErrStaleFence)
		}
		r := storage.Reservation{ID: uuid.Must(uuid.NewV7()).String(), Lines: storage.Lines{{SKU: "f3", Quantity: 1, Token: stale}}, Instance: "zk", Lock: "zookeeper", Token: stale}
		m := storage.Move{Seen: before, Epoch: old, Token: stale, Stock: -1, Reserved: 1}
		if _, _, err := s.Hold(ctx, storage.GuardFencing, r, time.Minute, []storage.Move{m}); !errors.Is(err, storage.ErrStaleFence) {
			t.Errorf("%s: the straggler's hold: %v, want %v", when, err, storage.ErrStaleFence)
		}
		if _, _, err := sweep(ctx, s, due, old, stale); !errors.Is(err, storage.ErrStaleSweeper) {
			t.Errorf("%s: the straggler's sweeper: %v, want %v", when, err, storage.ErrStaleSweeper)
		}
		after, err := s.Inventory(ctx, "f3")
		if err != nil {
			t.Fatal(err)
		}
		if after != before {
			t.Errorf("%s: the straggler's refused writes changed the row: %+v, was %+v", when, after, before)
		}
	}
	straggle("before any write of the new backend", a)

	// The new backend's first tokens.
	inv, err := s.Inventory(ctx, "f3")
	if err != nil {
		t.Fatal(err)
	}
	w := storage.Write{Guard: storage.GuardFencing, Orders: []storage.Order{newOrder("f3", 1, "")},
		Stock: inv.Stock, Version: inv.Version, Epoch: cur, Token: 3}
	if _, err := s.PlaceOrder(ctx, w, nil); err != nil {
		t.Errorf("the new backend's order under token 3: %v", err)
	}
	if _, err := s.PutInventory(ctx, storage.Put{SKU: "f3", Stock: 20, Epoch: cur, Token: 4}); err != nil {
		t.Errorf("the new backend's reset under token 4: %v", err)
	}
	if _, _, err := sweep(ctx, s, a, cur, 1); err != nil {
		t.Errorf("the new backend's sweeper under token 1: %v", err)
	}
	straggle("after the new backend wrote", b)

	// Nor can the straggler create a SKU (before, it did, with its
	// own fence, and sold on it beside the new backend).
	if _, err := s.PutInventory(ctx, storage.Put{SKU: "f3-new", Stock: 5, Epoch: old, Token: stale}); !errors.Is(err, storage.ErrStaleFence) {
		t.Errorf("the straggler's creation of a SKU: %v, want %v", err, storage.ErrStaleFence)
	}
	if _, err := s.Inventory(ctx, "f3-new"); !errors.Is(err, storage.ErrUnknownSKU) {
		t.Errorf("the SKU the straggler tried to create: %v, want %v", err, storage.ErrUnknownSKU)
	}
	if _, err := s.PutInventory(ctx, storage.Put{SKU: "f3-new", Stock: 6, Epoch: cur, Token: 5}); err != nil {
		t.Errorf("the new backend's creation of that SKU: %v", err)
	}
}

// TestAdoptionWaitsForAWriteInFlight: a straggler's fenced write whose
// UPDATE ran before the switch and whose commit comes after it (frozen
// between the two, its row lock held) lands before the adoption, which
// waits for the row: the fence ends at the new epoch all the same, and the
// new backend's first token passes.
func TestAdoptionWaitsForAWriteInFlight(t *testing.T) {
	t.Parallel()
	s, db := openStoreAndDB(t)
	ctx := t.Context()
	old, _, err := s.AdoptFences(ctx, storage.Fleet{Lock: "zookeeper", Guard: "fencing"})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := s.PutInventory(ctx, storage.Put{SKU: "fly", Stock: 10, Epoch: old, Token: 1 << 33})
	if err != nil {
		t.Fatal(err)
	}
	frozen, thaw := make(chan struct{}), make(chan struct{})
	wrote := make(chan error, 1)
	go func() {
		w := storage.Write{Guard: storage.GuardFencing, Orders: []storage.Order{newOrder("fly", 1, "")},
			Stock: inv.Stock, Version: inv.Version, Epoch: old, Token: 1 << 40}
		_, err := s.PlaceOrder(ctx, w, func() error { close(frozen); <-thaw; return nil })
		wrote <- err
	}()
	select {
	case <-frozen:
	case err := <-wrote:
		t.Fatalf("the straggler's write before the switch: %v, want it to reach its commit", err)
	}
	type adopted struct {
		epoch uint64
		err   error
	}
	adopt := make(chan adopted, 1)
	go func() {
		e, _, err := s.AdoptFences(ctx, storage.Fleet{Lock: "redis", Guard: "fencing"})
		adopt <- adopted{e, err}
	}()
	waitStatement(t, db, "UPDATE inventory SET fence = 0")
	close(thaw)
	if err := <-wrote; err != nil {
		t.Fatalf("the straggler's write in flight: %v", err)
	}
	a := <-adopt
	if a.err != nil {
		t.Fatal(a.err)
	}
	got, err := s.Inventory(ctx, "fly")
	if err != nil || got.FenceEpoch != a.epoch || got.Fence != 0 || got.Stock != 9 {
		t.Fatalf("after the adoption: %+v, %v; want fence (%d, 0), stock 9", got, err, a.epoch)
	}
	w := storage.Write{Guard: storage.GuardFencing, Orders: []storage.Order{newOrder("fly", 1, "")},
		Stock: got.Stock, Version: got.Version, Epoch: a.epoch, Token: 1}
	if _, err := s.PlaceOrder(ctx, w, nil); err != nil {
		t.Errorf("the new backend's first order: %v", err)
	}
}

// sweep is an expiry of reservation id (1 of one SKU) by lock's sweeper
// under (epoch, token), the SKU's write under the atomic guard: the
// sweeper fence alone decides.
func sweep(ctx context.Context, s *storage.Store, id string, epoch, token uint64) (storage.Reservation, []storage.Inventory, error) {
	r, err := s.Reservation(ctx, id)
	if err != nil {
		return storage.Reservation{}, nil, err
	}
	l := r.Lines[0]
	st := storage.Settlement{ID: id, To: storage.StatusExpired, By: "sweeper", SweepEpoch: epoch, SweepToken: token}
	return s.Settle(ctx, storage.GuardAtomic, st, []storage.Move{{Seen: storage.Inventory{SKU: l.SKU}, Stock: l.Quantity, Reserved: -l.Quantity}})
}
