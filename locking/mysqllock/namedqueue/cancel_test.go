package namedqueue_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/internal/mysqllocktest"
	"github.com/oversold-lab/oversold/locking/mysqllock/memtable"
	"github.com/oversold-lab/oversold/locking/mysqllock/namedqueue"
)

// What an Acquire whose ctx ends leaves behind when a grab is under way:
// neither case had a test, and the code for each could be taken out with
// every test still passing.

// A grant won as the caller gives up is freed (mysqllocktest has the why).
func TestGrantAsCallerGivesUpIsFreed(t *testing.T) {
	mysqllocktest.GrantAsCallerGivesUpIsFreed(t, testbed.MySQL(t), table, lockerWithTTL)
}

// A waiter first in line whose ctx ended as it was woken sends no grab: a
// row it won would only be deleted again, a turn lost to the next waiter.
// The test's hook ends ctx as the woken waiter's grab
// begins; no grant may then be made, which the next token shows: every
// grant in the test's database is the test's, and seq counts them all.
func TestCancelledWaiterSendsNoGrab(t *testing.T) {
	dsn := testbed.MySQL(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const ttl = 30 * time.Second
	holder := lockerWithTTL(t, dsn, ttl)
	table := memtable.New(openDB(t, dsn), ttl)
	line := namedqueue.New(table, 0, 0)
	waiter := mysqllock.New(table.DB(), mysqllock.Config{TTL: ttl, Table: table, Line: line})
	t.Cleanup(func() { waiter.Close() })
	// The waiter learns the epoch first: a grab with none would fail on
	// the server without a grant, mutant or not.
	warm, err := waiter.Acquire(ctx, "warm")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitCtx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	var woken atomic.Int32
	namedqueue.BeforeGrab(line, func(first bool) {
		if !first { // the grab after its wait in line
			woken.Add(1)
			giveUp()
		}
	})
	held, err := holder.Acquire(ctx, "sku/woken")
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 1)
	go func() {
		lease, err := waiter.Acquire(waitCtx, "sku/woken")
		if err == nil {
			lease.Release(ctx)
		}
		errs <- err
	}()
	db := openDB(t, dsn)
	waitFor(t, func() bool { // the waiter is in line, first
		var n int
		db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
WHERE DB = DATABASE() AND INFO LIKE 'SELECT GET_LOCK%' AND STATE = 'User lock'`).Scan(&n)
		return n > 0
	})
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-errs
	if !errors.Is(err, context.Canceled) {
		t.Errorf("the waiter given up as it was woken: %v, want context.Canceled", err)
	}
	if n := woken.Load(); n != 1 {
		t.Fatalf("the waiter began %d grabs after its wait in line, want 1: the test did not end ctx there", n)
	}
	if n := liveRows(t, db, "sku/woken"); n != 0 {
		t.Errorf("the waiter given up as it was woken left its row (%d)", n)
	}
	next, err := holder.Acquire(ctx, "sku/woken")
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() != held.Token()+1 {
		t.Errorf("token %#x after %#x: %d grants in between, want none (the waiter sent a grab after its ctx ended)",
			next.Token(), held.Token(), next.Token()-held.Token()-1)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// queued tells whether the holder of lease took the key's named lock (its
// row's owner prefix): a grant without it barged past the queue.
func queued(t *testing.T, db *sql.DB, lease locking.Lease) (q bool) {
	t.Helper()
	if err := db.QueryRowContext(t.Context(), `SELECT owner LIKE 'q%' FROM oversold_leases
WHERE lock_key = ? AND expires_at >= UTC_TIMESTAMP(6)`, lease.Key()).Scan(&q); err != nil {
		t.Error(err) // not Fatal: contenders call it from their goroutines
	}
	return q
}

// lockerWithTTL opens a Locker of ttl on a pool of its own, both closed
// when the test ends.
func lockerWithTTL(t *testing.T, dsn string, ttl time.Duration) *mysqllock.Locker {
	t.Helper()
	l := backends.NewMySQL(openDB(t, dsn), mysqllock.Config{TTL: ttl})
	t.Cleanup(func() { l.Close() })
	return l
}

func liveRows(t *testing.T, db *sql.DB, key string) int {
	return mysqllocktest.LiveRows(t, db, table, key)
}
