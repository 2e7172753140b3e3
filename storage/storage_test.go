package storage_test

import (
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/storage"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func openStore(t *testing.T) *storage.Store {
	t.Helper()
	s, err := storage.Open(t.Context(), testbed.MySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// openStoreAndDB is openStore with a plain connection pool of its own to
// the same database, for a session of another client (locks, processlist).
func openStoreAndDB(t *testing.T) (*storage.Store, *sql.DB) {
	t.Helper()
	dsn := testbed.MySQL(t)
	s, err := storage.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return s, db
}

func newOrder(sku string, q int64, key string) storage.Order {
	o := storage.Order{
		ID: uuid.Must(uuid.NewV7()).String(), SKU: sku, Quantity: q,
		Status: storage.StatusConfirmed, Instance: "test", Lock: "none",
		CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
	}
	if key != "" {
		o.IdempotencyKey = &key
	}
	return o
}

// put creates sku with stock and returns its row.
func put(t *testing.T, s *storage.Store, sku string, stock int64) storage.Inventory {
	t.Helper()
	inv, err := s.PutInventory(t.Context(), storage.Put{SKU: sku, Stock: stock})
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

func audit(t *testing.T, s *storage.Store, sku string) storage.Audit {
	t.Helper()
	a, err := s.Audit(t.Context(), sku)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestGuards runs each guard's passing and refusing write on MariaDB. A
// refused write must leave stock and orders as they were.
func TestGuards(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	ctx := t.Context()

	type tc struct {
		name  string
		guard storage.Guard
		// prepare runs a first write when the case needs a newer one in MySQL.
		prepare   bool
		write     func(inv storage.Inventory) storage.Write
		wantErr   error
		wantStock int64
	}
	cases := []tc{
		{name: "none writes what it read", guard: storage.GuardNone,
			write: func(inv storage.Inventory) storage.Write {
				return storage.Write{Stock: inv.Stock, Version: inv.Version}
			}, wantStock: 7},
		{name: "none overwrites a newer write: the lost update", guard: storage.GuardNone, prepare: true,
			write: func(inv storage.Inventory) storage.Write {
				return storage.Write{Stock: 10, Version: 1} // read before the prepare write
			}, wantStock: 7},
		{name: "version passes on the version read", guard: storage.GuardVersion,
			write: func(inv storage.Inventory) storage.Write {
				return storage.Write{Stock: inv.Stock, Version: inv.Version}
			}, wantStock: 7},
		{name: "version refuses a stale version", guard: storage.GuardVersion, prepare: true,
			write: func(inv storage.Inventory) storage.Write {
				return storage.Write{Stock: 10, Version: inv.Version - 1}
			}, wantErr: storage.ErrConflict, wantStock: 9},
		{name: "fencing passes a newer token", guard: storage.GuardFencing,
			write: func(inv storage.Inventory) storage.Write {
				return storage.Write{Stock: inv.Stock, Version: inv.Version, Token: 5}
			}, wantStock: 7},
		{name: "fencing refuses a newer token's stale read", guard: storage.GuardFencing, prepare: true,
			// A stale cache entry under a valid lease (a failover lost the
			// cache's updates): the token alone would pass.
			write: func(inv storage.Inventory) storage.Write {
				return storage.Write{Stock: 10, Version: inv.Version - 1, Token: inv.Fence + 10}
			}, wantErr: storage.ErrConflict, wantStock: 9},
		{name: "fencing refuses an older token", guard: storage.GuardFencing, prepare: true,
			write: func(inv storage.Inventory) storage.Write {
				return storage.Write{Stock: 10, Token: inv.Fence - 1}
			}, wantErr: storage.ErrStaleFence, wantStock: 9},
		{name: "fencing refuses the same token twice", guard: storage.GuardFencing, prepare: true,
			write: func(inv storage.Inventory) storage.Write {
				return storage.Write{Stock: inv.Stock, Token: inv.Fence}
			}, wantErr: storage.ErrStaleFence, wantStock: 9},
		{name: "atomic passes with enough stock", guard: storage.GuardAtomic,
			write:     func(storage.Inventory) storage.Write { return storage.Write{Stock: 999} },
			wantStock: 7},
		{name: "atomic refuses more than the stock", guard: storage.GuardAtomic,
			write:   func(storage.Inventory) storage.Write { return storage.Write{Stock: 999} },
			wantErr: storage.ErrOutOfStock, wantStock: 10},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sku := "guard-" + string(rune('a'+i))
			inv := put(t, s, sku, 10)
			q := int64(3)
			if c.wantErr == storage.ErrOutOfStock {
				q = 11
			}
			if c.prepare {
				// Another writer takes 1, with token 10, before our write.
				w := storage.Write{Guard: c.guard, Orders: []storage.Order{newOrder(sku, 1, "")}, Stock: 10, Version: inv.Version, Token: 10}
				var err error
				if inv, err = s.PlaceOrder(ctx, w, nil); err != nil {
					t.Fatal(err)
				}
			}
			before := audit(t, s, sku)

			w := c.write(inv)
			w.Guard, w.Orders = c.guard, []storage.Order{newOrder(sku, q, "")}
			got, err := s.PlaceOrder(ctx, w, nil)
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("PlaceOrder = %v, want %v", err, c.wantErr)
			}
			after := audit(t, s, sku)
			if after.Stock != c.wantStock {
				t.Errorf("stock = %d, want %d", after.Stock, c.wantStock)
			}
			if c.wantErr != nil {
				if after != before {
					t.Errorf("a refused write changed MySQL: %+v, then %+v", before, after)
				}
				return
			}
			if after.Orders != before.Orders+1 || after.Ordered != before.Ordered+q {
				t.Errorf("orders %+v after %+v: want one more of %d", after, before, q)
			}
			if got.Stock != c.wantStock || got.Version <= inv.Version {
				t.Errorf("read back %+v, want stock %d and a version above %d", got, c.wantStock, inv.Version)
			}
		})
	}
}

// TestPlaceOrderReturnsTheRow: what PlaceOrder returns for the cache is
// the row as the write left it, without a read-back inside the transaction:
// for every guard from a fresh read, and for atomic from a stale one (a
// write came between), where it reads the row after the commit.
func TestPlaceOrderReturnsTheRow(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	ctx := t.Context()
	for _, g := range storage.Guards {
		for _, stale := range []bool{false, true} {
			if stale && g != storage.GuardAtomic {
				continue // the others refuse or overwrite: see TestGuards
			}
			sku := "row-" + string(g)
			if stale {
				sku += "-stale"
			}
			read := put(t, s, sku, 50)
			if stale {
				other := storage.Write{Guard: g, Orders: []storage.Order{newOrder(sku, 5, "")}, Stock: read.Stock, Version: read.Version}
				if _, err := s.PlaceOrder(ctx, other, nil); err != nil {
					t.Fatal(err)
				}
			}
			w := storage.Write{Guard: g, Orders: []storage.Order{newOrder(sku, 3, "")}, Stock: read.Stock, Version: read.Version, Token: 9}
			got, err := s.PlaceOrder(ctx, w, nil)
			if err != nil {
				t.Fatalf("%s: %v", sku, err)
			}
			row, err := s.Inventory(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			if got.SKU != row.SKU || got.Stock != row.Stock || got.Version != row.Version {
				t.Errorf("%s: returned %s stock %d version %d, MySQL holds %s stock %d version %d",
					sku, got.SKU, got.Stock, got.Version, row.SKU, row.Stock, row.Version)
			}
		}
	}
}

func TestUnknownSKU(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	for _, g := range storage.Guards {
		w := storage.Write{Guard: g, Orders: []storage.Order{newOrder("nope", 1, "")}, Stock: 5, Token: 1}
		if _, err := s.PlaceOrder(t.Context(), w, nil); !errors.Is(err, storage.ErrUnknownSKU) {
			t.Errorf("guard %s: PlaceOrder = %v, want ErrUnknownSKU", g, err)
		}
	}
	if _, err := s.Inventory(t.Context(), "nope"); !errors.Is(err, storage.ErrUnknownSKU) {
		t.Errorf("Inventory = %v, want ErrUnknownSKU", err)
	}
	if _, err := s.Order(t.Context(), uuid.NewString()); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("Order = %v, want ErrNotFound", err)
	}
}

// TestDuplicateKey: the UNIQUE index refuses a second order with one key,
// and its transaction takes the stock write back with it.
func TestDuplicateKey(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	ctx := t.Context()
	put(t, s, "dup", 10)
	first := newOrder("dup", 2, "key-1")
	if _, err := s.PlaceOrder(ctx, storage.Write{Guard: storage.GuardAtomic, Orders: []storage.Order{first}}, nil); err != nil {
		t.Fatal(err)
	}
	_, err := s.PlaceOrder(ctx, storage.Write{Guard: storage.GuardAtomic, Orders: []storage.Order{newOrder("dup", 2, "key-1")}}, nil)
	if !errors.Is(err, storage.ErrDuplicate) {
		t.Fatalf("second PlaceOrder = %v, want ErrDuplicate", err)
	}
	if a := audit(t, s, "dup"); a.Stock != 8 || a.Orders != 1 || a.DuplicateKeys != 0 {
		t.Errorf("audit %+v, want stock 8 and one order", a)
	}
	got, err := s.OrderByKey(ctx, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != first.ID || !got.CreatedAt.Equal(first.CreatedAt) || *got.IdempotencyKey != "key-1" {
		t.Errorf("OrderByKey = %+v, want %+v", got, first)
	}
}

// TestFailedTransaction: an error before the commit leaves stock and orders
// untouched, and is returned as is.
func TestFailedTransaction(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	put(t, s, "fail", 10)
	boom := errors.New("lease lost")
	for _, g := range storage.Guards {
		w := storage.Write{Guard: g, Orders: []storage.Order{newOrder("fail", 4, "k-"+string(g))}, Stock: 10, Version: 1, Token: 1}
		if _, err := s.PlaceOrder(t.Context(), w, func() error { return boom }); !errors.Is(err, boom) {
			t.Errorf("guard %s: PlaceOrder = %v, want %v", g, err, boom)
		}
	}
	if a := audit(t, s, "fail"); a.Stock != 10 || a.Orders != 0 {
		t.Errorf("audit %+v after failed transactions, want stock 10 and no orders", a)
	}
	inv, err := s.Inventory(t.Context(), "fail")
	if err != nil || inv.Version != 1 || inv.Fence != 0 {
		t.Errorf("inventory %+v, %v: want version 1 and fence 0 untouched", inv, err)
	}
}

// TestConcurrentMigrations: three replicas starting at once on a fresh
// database all migrate, and a later start finds nothing to do.
func TestConcurrentMigrations(t *testing.T) {
	t.Parallel()
	dsn := testbed.MySQL(t)
	start := make(chan struct{})
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			<-start
			s, err := storage.Open(t.Context(), dsn)
			if err == nil {
				s.Close()
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: %v", i, err)
		}
	}
	s, err := storage.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	put(t, s, "m", 1)
}

// TestOpenCreatesDatabase: orderd starts on a server without its database.
func TestOpenCreatesDatabase(t *testing.T) {
	t.Parallel()
	dsn := testbed.MySQL(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.ExecContext(t.Context(), "DROP DATABASE `"+cfg.DBName+"`")
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, err := storage.Open(t.Context(), dsn)
	if err != nil {
		t.Fatalf("Open without the database: %v", err)
	}
	defer s.Close()
	put(t, s, "created", 1)
}

func TestPutInventory(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	ctx := t.Context()
	inv := put(t, s, "p", 5)
	if inv.Stock != 5 || inv.Version != 1 || inv.Fence != 0 {
		t.Fatalf("created %+v, want stock 5 version 1 fence 0", inv)
	}
	w := storage.Write{Guard: storage.GuardFencing, Orders: []storage.Order{newOrder("p", 1, "")}, Stock: 5, Version: inv.Version, Token: 7}
	if _, err := s.PlaceOrder(ctx, w, nil); err != nil {
		t.Fatal(err)
	}
	inv = put(t, s, "p", 100)
	if inv.Stock != 100 || inv.Version != 3 || inv.Fence != 7 {
		t.Errorf("reset %+v, want stock 100, version 3 and the fence kept at 7", inv)
	}
}

func TestReplicas(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	ctx := t.Context()
	for _, r := range []storage.Replica{
		{Instance: "r1", Lock: "redis", Guard: "version"},
		{Instance: "r2", Lock: "local", Guard: "none"},
	} {
		if err := s.Heartbeat(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// A second heartbeat updates the row in place, with the lock servers'
	// identity.
	if err := s.Heartbeat(ctx, storage.Replica{Instance: "r2", Lock: "etcd", LockID: "cluster-b", Guard: "fencing"}); err != nil {
		t.Fatal(err)
	}
	live, err := s.LiveReplicas(ctx, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 2 || live[1].Instance != "r2" || live[1].Lock != "etcd" || live[1].LockID != "cluster-b" || live[1].Guard != "fencing" || live[0].LockID != "" {
		t.Fatalf("live = %+v, want r1 (no lock id) and r2 (etcd on cluster-b, fencing)", live)
	}
	if err := s.RemoveReplica(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if live, err = s.LiveReplicas(ctx, 10*time.Millisecond); err != nil || len(live) != 0 {
		t.Errorf("live within 10ms, 20ms later = %+v, %v; want none", live, err)
	}
}

func TestMaskDSN(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"root@tcp(127.0.0.1:3306)/oversold?parseTime=true", "root@tcp(127.0.0.1:3306)/oversold?parseTime=true"},
		{"app:s3cret@tcp(db:3306)/oversold", "app:***@tcp(db:3306)/oversold"},
		{"app:p@ss:w/rd@tcp(db)/x?a=b", "app:***@tcp(db)/x?a=b"},
		{"app:pw@/x", "app:***@/x"},
		{"/x", "/x"},
	} {
		if got := storage.MaskDSN(c.in); got != c.want {
			t.Errorf("MaskDSN(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
