package storage_test

import (
	"bytes"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/storage"
)

// TestExactIdentity: SKUs, keys and ids are exact byte strings. MariaDB's
// default collation takes "HOT-1" for "hot-1" and "k " for "k"; the store
// must take them for different rows, as the locks and the cache do.
func TestExactIdentity(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	ctx := t.Context()
	put(t, s, "hot-1", 5)
	if inv := put(t, s, "HOT-1", 7); inv.Stock != 7 || inv.Version != 1 {
		t.Fatalf("PUT HOT-1 after hot-1 = %+v: want a new row (stock 7, version 1), not a reset of hot-1", inv)
	}
	if inv, err := s.Inventory(ctx, "hot-1"); err != nil || inv.Stock != 5 {
		t.Errorf("hot-1 = %+v, %v; want its own stock 5", inv, err)
	}
	if _, err := s.Inventory(ctx, "Hot-1"); !errors.Is(err, storage.ErrUnknownSKU) {
		t.Errorf("Inventory(Hot-1) = %v, want ErrUnknownSKU", err)
	}

	first := newOrder("hot-1", 1, "Key-a")
	if _, err := s.PlaceOrder(ctx, storage.Write{Guard: storage.GuardAtomic, Orders: []storage.Order{first}}, nil); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"key-A", "Key-a ", "KEY-A"} {
		if _, err := s.OrderByKey(ctx, key); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("OrderByKey(%q) = %v, want ErrNotFound: only %q was used", key, err, "Key-a")
		}
		if _, err := s.PlaceOrder(ctx, storage.Write{Guard: storage.GuardAtomic, Orders: []storage.Order{newOrder("hot-1", 1, key)}}, nil); err != nil {
			t.Errorf("order under %q after %q: %v, want a second order", key, "Key-a", err)
		}
	}
	if _, err := s.Order(ctx, first.ID+" "); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Order(id + space) = %v, want ErrNotFound", err)
	}
	if a := audit(t, s, "hot-1"); a.Orders != 4 || a.Stock != 1 {
		t.Errorf("hot-1 audit %+v, want 4 orders and stock 1", a)
	}
}

// TestMigrateFromCaseInsensitive: a database made by an earlier release
// (VARCHAR columns in the server's default, case-insensitive collation,
// orders without fingerprints) is migrated by three replicas starting at
// once: rows kept, identities made exact, fingerprints filled in with the
// digest OrderFingerprint computes, one database identity for all.
func TestMigrateFromCaseInsensitive(t *testing.T) {
	t.Parallel()
	dsn := testbed.MySQL(t)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		`CREATE TABLE inventory (sku varchar(64) NOT NULL PRIMARY KEY, stock bigint NOT NULL,
			version bigint unsigned NOT NULL, fence bigint unsigned NOT NULL,
			created_at datetime(6) NOT NULL, updated_at datetime(6) NOT NULL)`,
		`CREATE TABLE orders (id char(36) NOT NULL PRIMARY KEY, sku varchar(64) NOT NULL, quantity bigint NOT NULL,
			status varchar(16) NOT NULL, instance varchar(255) NOT NULL, ` + "`lock`" + ` varchar(16) NOT NULL,
			token bigint unsigned NOT NULL, idempotency_key varchar(255) NULL, created_at datetime(6) NOT NULL,
			UNIQUE KEY idx_orders_idempotency_key (idempotency_key), KEY idx_orders_sku (sku))`,
		`INSERT INTO inventory VALUES ('Old-1', 9, 2, 0, NOW(6), NOW(6))`,
		`INSERT INTO orders VALUES ('0190a0a0-0000-7000-8000-000000000001', 'Old-1', 3, 'confirmed', 'r1', 'redis', 4, 'Key-a', NOW(6))`,
	} {
		if _, err := db.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	start := make(chan struct{})
	stores := make([]*storage.Store, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range stores {
		wg.Go(func() {
			<-start
			stores[i], errs[i] = storage.Open(t.Context(), dsn)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		t.Cleanup(func() { stores[i].Close() })
	}
	s := stores[0]
	for _, other := range stores[1:] {
		if other.DatabaseIdentity() != s.DatabaseIdentity() || s.DatabaseIdentity() == "" {
			t.Errorf("identities %q and %q: want one, not empty", s.DatabaseIdentity(), other.DatabaseIdentity())
		}
	}

	var n int
	err = db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND DATA_TYPE = 'varbinary'
		AND (TABLE_NAME, COLUMN_NAME) IN (('inventory','sku'), ('orders','id'), ('orders','sku'), ('orders','idempotency_key'))`).Scan(&n)
	if err != nil || n != 4 {
		t.Errorf("%d of 4 identity columns are VARBINARY (%v)", n, err)
	}
	o, err := s.OrderByKey(t.Context(), "Key-a")
	if err != nil {
		t.Fatal(err)
	}
	if want := storage.OrderFingerprint("Old-1", 3); !bytes.Equal(o.Fingerprint, want) {
		t.Errorf("migrated fingerprint %x, want %x (what OrderFingerprint says)", o.Fingerprint, want)
	}
	if _, err := s.OrderByKey(t.Context(), "key-a"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("OrderByKey(key-a) after migration = %v, want ErrNotFound", err)
	}
	if inv := put(t, s, "old-1", 1); inv.Version != 1 {
		t.Errorf("PUT old-1 = %+v: want a new SKU beside Old-1", inv)
	}
	if inv, err := s.Inventory(t.Context(), "Old-1"); err != nil || inv.Stock != 9 || inv.Version != 2 {
		t.Errorf("Old-1 = %+v, %v; want stock 9 version 2 kept", inv, err)
	}
}

// TestDatabaseIdentity: one database keeps its identity across opens;
// another database has its own.
func TestDatabaseIdentity(t *testing.T) {
	t.Parallel()
	dsn := testbed.MySQL(t)
	a, err := storage.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	id := a.DatabaseIdentity()
	a.Close()
	b := openStore(t) // another database
	again, err := storage.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if again.DatabaseIdentity() != id || b.DatabaseIdentity() == id || id == "" {
		t.Errorf("identities: first %q, reopened %q, other database %q", id, again.DatabaseIdentity(), b.DatabaseIdentity())
	}
}

// TestPutConditions: If-Match and the fence. A refused reset changes
// nothing; a reset under a token raises the fence, so that an older
// holder's write after it is refused.
func TestPutConditions(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	ctx := t.Context()
	inv := put(t, s, "pc", 10) // version 1
	if _, err := s.PutInventory(ctx, storage.Put{SKU: "pc", Stock: 50, IfVersion: 2}); !errors.Is(err, storage.ErrPrecondition) {
		t.Errorf("reset if version 2 of version 1 = %v, want ErrPrecondition", err)
	}
	if _, err := s.PutInventory(ctx, storage.Put{SKU: "pc-missing", Stock: 50, IfVersion: 1}); !errors.Is(err, storage.ErrPrecondition) {
		t.Errorf("reset if version 1 of a missing SKU = %v, want ErrPrecondition", err)
	}
	inv, err := s.PutInventory(ctx, storage.Put{SKU: "pc", Stock: 50, IfVersion: inv.Version, Token: 9})
	if err != nil || inv.Stock != 50 || inv.Version != 2 || inv.Fence != 9 {
		t.Fatalf("reset under token 9 = %+v, %v; want stock 50 version 2 fence 9", inv, err)
	}
	if _, err := s.PutInventory(ctx, storage.Put{SKU: "pc", Stock: 70, Token: 9}); !errors.Is(err, storage.ErrStaleFence) {
		t.Errorf("reset under the same token again = %v, want ErrStaleFence", err)
	}
	// A holder with token 8 read before the reset and writes after it.
	w := storage.Write{Guard: storage.GuardFencing, Orders: []storage.Order{newOrder("pc", 1, "")}, Stock: 10, Token: 8}
	if _, err := s.PlaceOrder(ctx, w, nil); !errors.Is(err, storage.ErrStaleFence) {
		t.Errorf("older holder's write after the reset = %v, want ErrStaleFence", err)
	}
	if a := audit(t, s, "pc"); a.Stock != 50 || a.Orders != 0 {
		t.Errorf("audit %+v, want the reset's stock 50 and no order", a)
	}
}

// TestInventoryLatest: while another transaction has written the row and
// not committed (a holder frozen between its UPDATE and its COMMIT), a
// plain read sees the old stock and InventoryLatest waits for the commit
// and sees the new one.
func TestInventoryLatest(t *testing.T) {
	t.Parallel()
	s, db := openStoreAndDB(t)
	put(t, s, "lat", 10)
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(t.Context(), "UPDATE inventory SET stock = 7, version = version + 1 WHERE sku = 'lat'"); err != nil {
		t.Fatal(err)
	}
	latest := make(chan storage.Inventory, 1)
	go func() {
		inv, err := s.InventoryLatest(t.Context(), "lat")
		if err != nil {
			t.Error(err)
		}
		latest <- inv
	}()
	if inv, err := s.Inventory(t.Context(), "lat"); err != nil || inv.Stock != 10 {
		t.Errorf("plain read during the write: %+v, %v; want the committed 10", inv, err)
	}
	select {
	case inv := <-latest:
		t.Fatalf("InventoryLatest returned %+v before the writer committed", inv)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if inv := <-latest; inv.Stock != 7 || inv.Version != 2 {
		t.Errorf("InventoryLatest after the commit: %+v, want stock 7 version 2", inv)
	}
	if _, err := s.InventoryLatest(t.Context(), "lat-none"); !errors.Is(err, storage.ErrUnknownSKU) {
		t.Errorf("InventoryLatest of a missing SKU: %v, want ErrUnknownSKU", err)
	}
}
