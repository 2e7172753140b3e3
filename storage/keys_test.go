package storage_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/storage"
)

// openDSN opens a store on dsn (one replica's pool).
func openDSN(t *testing.T, dsn string) *storage.Store {
	t.Helper()
	s, err := storage.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// keyedHold holds one unit of sku under key, as the flow writes a hold.
func keyedHold(ctx context.Context, s *storage.Store, sku, key string) (string, error) {
	r := storage.Reservation{
		ID: uuid.Must(uuid.NewV7()).String(), Lines: storage.Lines{{SKU: sku, Quantity: 1}},
		Instance: "t", Lock: "none", IdempotencyKey: &key,
		Fingerprint: storage.ReservationFingerprint([]storage.Line{{SKU: sku, Quantity: 1}}, 0),
	}
	_, _, err := s.Hold(ctx, storage.GuardAtomic, r, time.Hour, []storage.Move{{Seen: storage.Inventory{SKU: sku}, Stock: -1, Reserved: 1}})
	return r.ID, err
}

// keyedOrder places one order of one unit of sku under key.
func keyedOrder(ctx context.Context, s *storage.Store, guard storage.Guard, sku, key string) error {
	inv, err := s.Inventory(ctx, sku)
	if err != nil {
		return err
	}
	o := newOrder(sku, 1, key)
	_, err = s.PlaceOrder(ctx, storage.Write{Guard: guard, Orders: []storage.Order{o}, Stock: inv.Stock, Version: inv.Version, Token: inv.Fence + 1}, nil)
	return err
}

// TestKeyNamesOneRequest: MySQL itself refuses a key taken by the other
// kind of request, under every guard: a hold under an order's key, and an
// order under a hold's key, are ErrDuplicate and write nothing. Keys are
// exact bytes. Before the shared key table, orders and reservations each
// had their own UNIQUE index, and both writes went through.
func TestKeyNamesOneRequest(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	ctx := t.Context()
	put(t, s, "kn", 100)

	if err := keyedOrder(ctx, s, storage.GuardAtomic, "kn", "Key-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := keyedHold(ctx, s, "kn", "Key-a"); !errors.Is(err, storage.ErrDuplicate) {
		t.Errorf("a hold under an order's key: %v, want ErrDuplicate", err)
	}
	if _, err := keyedHold(ctx, s, "kn", "k-hold"); err != nil {
		t.Fatal(err)
	}
	for _, g := range storage.Guards {
		if err := keyedOrder(ctx, s, g, "kn", "k-hold"); !errors.Is(err, storage.ErrDuplicate) {
			t.Errorf("guard %s: an order under a hold's key: %v, want ErrDuplicate", g, err)
		}
	}
	if a := audit(t, s, "kn"); a.Stock != 98 || a.Reserved != 1 || a.Orders != 1 {
		t.Errorf("audit %+v, want stock 98, 1 reserved, 1 order: the refused writes took nothing", a)
	}
	// Exact bytes: key-A and "Key-a " are other keys than Key-a.
	for _, key := range []string{"key-A", "Key-a "} {
		if _, err := keyedHold(ctx, s, "kn", key); err != nil {
			t.Errorf("a hold under %q: %v, want a new key", key, err)
		}
	}
	if err := keyedOrder(ctx, s, storage.GuardAtomic, "kn", "K-hold"); err != nil {
		t.Errorf("an order under K-hold: %v, want a new key", err)
	}
}

// TestKeyRace: for each of 30 keys, an order and a hold under it, on two
// connection pools (two replicas), released at once: one of the two writes
// commits, the other is ErrDuplicate and takes nothing.
func TestKeyRace(t *testing.T) {
	t.Parallel()
	dsn := testbed.MySQL(t)
	a, b := openDSN(t, dsn), openDSN(t, dsn)
	ctx := t.Context()
	const keys = 30
	put(t, a, "kr-o", 1000)
	put(t, a, "kr-h", 1000)

	orderErrs, holdErrs := make([]error, keys), make([]error, keys)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range keys {
		key := fmt.Sprintf("race-%d", i)
		so, sh := a, b
		if i%2 == 1 {
			so, sh = b, a
		}
		wg.Go(func() {
			<-start
			orderErrs[i] = keyedOrder(ctx, so, storage.GuardAtomic, "kr-o", key)
		})
		wg.Go(func() {
			<-start
			_, holdErrs[i] = keyedHold(ctx, sh, "kr-h", key)
		})
	}
	close(start)
	wg.Wait()
	var orders, holds int64
	for i := range keys {
		oe, he := orderErrs[i], holdErrs[i]
		switch {
		case oe == nil && errors.Is(he, storage.ErrDuplicate):
			orders++
		case he == nil && errors.Is(oe, storage.ErrDuplicate):
			holds++
		default:
			t.Errorf("key race-%d: order %v, hold %v; want one nil and one ErrDuplicate", i, oe, he)
		}
	}
	t.Logf("%d keys went to orders, %d to holds", orders, holds)
	if o, h := audit(t, a, "kr-o"), audit(t, a, "kr-h"); o.Stock != 1000-orders || o.Orders != orders || h.Stock != 1000-holds || h.Reserved != holds {
		t.Errorf("kr-o %+v, kr-h %+v: want %d orders and %d holds taken", o, h, orders, holds)
	}
}

// TestKeyTableMigration: a database of an older version, without the
// shared key table, with keyed orders and reservations (one key in both,
// as the older version allowed), is migrated: every key it holds is taken
// for both kinds afterwards.
func TestKeyTableMigration(t *testing.T) {
	t.Parallel()
	dsn := testbed.MySQL(t)
	s := openDSN(t, dsn)
	ctx := t.Context()
	put(t, s, "km", 100)
	if err := keyedOrder(ctx, s, storage.GuardAtomic, "km", "old-order"); err != nil {
		t.Fatal(err)
	}
	if _, err := keyedHold(ctx, s, "km", "old-hold"); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		"DROP TABLE idempotency_keys",
		// What the older version let through: the order's key on a hold too.
		"INSERT INTO reservations (id, status, `lines`, expires_at, instance, `lock`, token, idempotency_key, created_at, settled_by) " +
			"VALUES ('" + uuid.Must(uuid.NewV7()).String() + "', 'held', '[{\"sku\":\"km\",\"quantity\":1}]', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, 'old', 'none', 0, 'old-order', UTC_TIMESTAMP(6), '')",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	m := openDSN(t, dsn) // migrates
	if _, err := keyedHold(ctx, m, "km", "old-order"); !errors.Is(err, storage.ErrDuplicate) {
		t.Errorf("a hold under a migrated order's key: %v, want ErrDuplicate", err)
	}
	if err := keyedOrder(ctx, m, storage.GuardAtomic, "km", "old-hold"); !errors.Is(err, storage.ErrDuplicate) {
		t.Errorf("an order under a migrated hold's key: %v, want ErrDuplicate", err)
	}
	var kind string
	if err := db.QueryRowContext(ctx, "SELECT kind FROM idempotency_keys WHERE idempotency_key = 'old-order'").Scan(&kind); err != nil || kind != "order" {
		t.Errorf("old-order is a key of kind %q (%v), want order: the order keeps a key both kinds held", kind, err)
	}
	if err := keyedOrder(ctx, m, storage.GuardAtomic, "km", "new-key"); err != nil {
		t.Errorf("an order under a new key after the migration: %v", err)
	}
	openDSN(t, dsn) // a second migration finds nothing to do, and fails on nothing
}
