package mysqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/mysqllock"
)

// A grant won as the caller gives up is freed: the grab statement is never
// abandoned halfway, so it can land just as ctx ends; its row must then be
// freed, or the key stays blocked for a whole TTL with nobody holding it.
// The grab is held up by a table lock until ctx has ended, then let
// through.
func TestGrantAsCallerGivesUpIsFreed(t *testing.T) {
	dsn := testbed.MySQL(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const ttl = 30 * time.Second // a row left behind outlives every wait below
	l := lockerWithTTL(t, dsn, ttl)
	callerCtx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	unlock, acquired := acquireHeldUp(t, callerCtx, l, dsn, "sku/given-up")
	giveUp()
	unlock()
	r := <-acquired
	if r.err == nil {
		t.Fatalf("Acquire given up during its grab returned a lease (token %#x) and no error", r.lease.Token())
	}
	if !errors.Is(r.err, context.Canceled) {
		t.Errorf("Acquire given up during its grab: %v, want context.Canceled", r.err)
	}
	if n := liveRows(t, openDB(t, dsn), "sku/given-up"); n != 0 {
		t.Errorf("the grant won as the caller gave up keeps its row (%d): the key is blocked for a TTL", n)
	}
	rctx, rcancel := context.WithTimeout(ctx, ttl/2)
	defer rcancel()
	lease, err := lockerWithTTL(t, dsn, ttl).Acquire(rctx, "sku/given-up")
	if err != nil {
		t.Fatalf("a rival after the caller gave up: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A grant that lands while Close runs is freed at once, and Acquire fails:
// otherwise it returned a lease already Lost and the row kept the key from
// everyone for a TTL. The grab is held up by a table lock until Close has
// begun.
func TestGrantDuringCloseIsFreed(t *testing.T) {
	dsn := testbed.MySQL(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	l := lockerWithTTL(t, dsn, 30*time.Second)
	unlock, acquired := acquireHeldUp(t, ctx, l, dsn, "sku/closing")
	closed := make(chan struct{})
	go func() {
		l.Close()
		close(closed)
	}()
	waitFor(t, func() bool { return mysqllock.Closed(l) })
	unlock()
	r := <-acquired
	<-closed
	if r.err == nil {
		t.Errorf("Acquire during Close returned a lease (token %#x) and no error", r.lease.Token())
	}
	if n := liveRows(t, openDB(t, dsn), "sku/closing"); n != 0 {
		t.Errorf("the grant that landed during Close keeps its row (%d): the key is blocked for a TTL", n)
	}
	t.Logf("Acquire during Close: %v", r.err)
}

type acquired struct {
	lease locking.Lease
	err   error
}

// acquireHeldUp starts l.Acquire(ctx, key), l on the database of dsn, with
// its grab held up by a table lock, and returns once the grab waits for it:
// unlock lets it through, and the Acquire's result then comes on the
// channel. A first turn on another key makes the table and the statements.
func acquireHeldUp(t *testing.T, ctx context.Context, l *mysqllock.Locker, dsn, key string) (unlock func(), result <-chan acquired) {
	t.Helper()
	warm, err := l.Acquire(ctx, "warm")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other := openDB(t, dsn)
	blocker, err := other.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blocker.Close() })
	if _, err := blocker.ExecContext(t.Context(), "LOCK TABLES oversold_locks WRITE"); err != nil {
		t.Fatal(err)
	}
	res := make(chan acquired, 1)
	go func() {
		s, err := l.Acquire(ctx, key)
		res <- acquired{s, err}
	}()
	waitFor(t, func() bool { // the grab waits for the table lock
		var n int
		other.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM information_schema.PROCESSLIST
WHERE DB = DATABASE() AND INFO LIKE 'INSERT INTO oversold_locks%' AND STATE LIKE '%lock%'`).Scan(&n)
		return n > 0
	})
	return func() {
		if _, err := blocker.ExecContext(t.Context(), "UNLOCK TABLES"); err != nil {
			t.Fatal(err)
		}
	}, res
}

// lockerWithTTL opens a recipe Locker of ttl on a pool of its own, both
// closed when the test ends.
func lockerWithTTL(t *testing.T, dsn string, ttl time.Duration) *mysqllock.Locker {
	t.Helper()
	l := mysqllock.New(openDB(t, dsn), mysqllock.Config{TTL: ttl})
	t.Cleanup(func() { l.Close() })
	return l
}

// liveRows counts the key's rows whose lease has not run out.
func liveRows(t *testing.T, db *sql.DB, key string) (n int) {
	t.Helper()
	if err := db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM oversold_locks
WHERE lock_key = ? AND expires_at >= UTC_TIMESTAMP(6)`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
	}
}
