package memtable_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/namedqueue"
)

// A full lease table (max_heap_table_size; here MAX_ROWS) of expired rows
// (holders that died, releases that never arrived) must not stop the lock:
// the grab sweeps expired rows and tries again, also for a key whose own
// expired row is there. Before the fix every Acquire failed
// with 1114 until a restart. A table full of live leases fails with
// ErrUnavailable saying so, not as a broken queue connection.
func TestFullTableOfExpiredRows(t *testing.T) {
	dsn := testbed.MySQL(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	db := openDB(t, dsn)
	l := backends.NewMySQL(db, mysqllock.Config{TTL: 5 * time.Second})
	defer l.Close()
	first, err := l.Acquire(ctx, "first") // creates the tables
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, "ALTER TABLE oversold_leases MAX_ROWS = 50")
	fill := func(prefix, expires string) {
		t.Helper()
		_, err := db.ExecContext(ctx, `INSERT INTO oversold_leases (lock_key, epoch, owner, expires_at)
SELECT CONCAT(?, seq), 1, 'p0000000000000000000000000000000', `+expires+` FROM seq_1_to_1000`, prefix)
		if !strings.Contains(errText(err), "is full") {
			t.Fatalf("filling the table: %v, want 1114 (table full)", err)
		}
	}
	fill("sku/dead/", "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR")
	for _, key := range []string{"sku/dead/7", "sku/new"} { // its own expired row; none
		lease, err := l.Acquire(ctx, key)
		if err != nil {
			t.Fatalf("Acquire(%q) on a table full of expired rows: %v", key, err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The plain grab too: a stuck holder of the key's named lock (a
	// paused connection) sends the waiter there after a wait.
	fill("sku/dead/again/", "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR")
	stuck, err := openDB(t, dsn).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	if _, err := stuck.ExecContext(ctx, "SELECT GET_LOCK(?, 0)", namedqueue.QueueName("sku/plain")); err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, "sku/plain")
	if err != nil {
		t.Fatalf("Acquire past a stuck named lock on a table full of expired rows: %v", err)
	}
	var queued bool
	if err := db.QueryRowContext(ctx, `SELECT owner LIKE 'q%' FROM oversold_leases WHERE lock_key = 'sku/plain'`).Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if queued {
		t.Error("granted through the named lock, which another connection holds: the plain grab was not tested")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	fill("sku/live/", "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR")
	_, err = l.Acquire(ctx, "sku/another")
	if !errors.Is(err, locking.ErrUnavailable) || !strings.Contains(err.Error(), "full") ||
		strings.Contains(err.Error(), "queue connection") {
		t.Errorf("Acquire on a table full of live leases: %v, want ErrUnavailable saying the table is full", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM oversold_leases WHERE lock_key LIKE 'sku/live/%'`).Scan(&n); err != nil || n == 0 {
		t.Errorf("live leases after the sweep: %d (%v), want them all kept", n, err)
	}
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
