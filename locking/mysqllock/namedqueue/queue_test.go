package namedqueue_test

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/namedqueue"
)

// newLocker opens a Locker with its own pool, polling every poll: tests set
// it so long that a waiter that polls instead of being woken fails them.
func newLocker(t *testing.T, dsn string, poll time.Duration) *mysqllock.Locker {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(32)
	l := backends.NewMySQL(db, mysqllock.Config{TTL: 10 * time.Second, MinPoll: poll, MaxPoll: poll})
	t.Cleanup(func() {
		l.Close()
		db.Close()
	})
	return l
}

// A release wakes the waiter at once: with polling every 30 s, only the
// queue can hand the key over within seconds.
func TestReleaseWakesWaiter(t *testing.T) {
	dsn := testbed.MySQL(t)
	const poll = 30 * time.Second
	holder, waiter := newLocker(t, dsn, poll), newLocker(t, dsn, poll)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	lease, err := holder.Acquire(ctx, "sku/queue")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	errs := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "sku/queue")
		if err != nil {
			errs <- err
			return
		}
		got <- time.Now()
		if err := l.Release(context.Background()); err != nil {
			errs <- err
		}
	}()
	// The waiter is queued once it blocks in GET_LOCK (a fixed 500 ms
	// sleep released a waiter slow to start on a loaded machine before it
	// queued: it then waited a poll).
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	waitFor(t, func() bool {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
WHERE DB = DATABASE() AND INFO LIKE 'SELECT GET_LOCK%' AND STATE = 'User lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	select {
	case <-got:
		t.Fatal("the waiter got the key while it was held")
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	released := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		d := at.Sub(released)
		t.Logf("the waiter got the key %v after the release", d)
		if d > 5*time.Second {
			t.Errorf("the waiter got the key %v after the release: it polled (every %v) instead of being woken", d, poll)
		}
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(poll + 10*time.Second):
		t.Fatalf("the waiter did not get the key %v after the release", poll+10*time.Second)
	}
}

// A named lock kept by someone who is not the key's holder (a holder paused
// past its lease, still connected) does not keep a free key from being
// taken: the wait on it is bounded by MaxPoll.
func TestStaleNamedLockDoesNotBlock(t *testing.T) {
	dsn := testbed.MySQL(t)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var got int
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", namedqueue.QueueName("sku/stale")).Scan(&got); err != nil || got != 1 {
		t.Fatalf("GET_LOCK = %d, %v", got, err)
	}
	l := newLocker(t, dsn, 100*time.Millisecond)
	began := time.Now()
	lease, err := l.Acquire(ctx, "sku/stale")
	if err != nil {
		t.Fatal(err)
	}
	d := time.Since(began)
	t.Logf("a free key took %v to acquire behind a stale named lock", d)
	if d > 5*time.Second { // about max(2 MaxPoll, TTL/10) = 1 s; half the TTL
		t.Errorf("a free key took %v to acquire behind a stale named lock", d)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// And the stale named lock stays where it was: nobody released it for us.
	var holder sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", namedqueue.QueueName("sku/stale")).Scan(&holder); err != nil || holder.Int64 != 1 {
		t.Errorf("the stale named lock changed hands: %v, %v", holder, err)
	}
}

// An idle queue connection the server dropped (KILL, a restart, its
// wait_timeout) costs a retry, not a failed Acquire.
func TestDroppedQueueConnection(t *testing.T) {
	dsn := testbed.MySQL(t)
	l := newLocker(t, dsn, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	lease, err := l.Acquire(ctx, "sku/dropped")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Kill every other connection to this test's database: the Locker's
	// idle queue connection among them.
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rows, err := conn.QueryContext(ctx, `SELECT ID FROM information_schema.PROCESSLIST
		WHERE DB = DATABASE() AND ID <> CONNECTION_ID()`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if len(ids) == 0 {
		t.Fatal("no connection of the Locker to kill")
	}
	for _, id := range ids {
		if _, err := conn.ExecContext(ctx, "KILL ?", id); err != nil {
			t.Fatalf("KILL %d: %v", id, err)
		}
	}
	if lease, err = l.Acquire(ctx, "sku/dropped"); err != nil {
		t.Fatalf("Acquire after the server dropped the Locker's connections: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// On a hot key every grant goes to a waiter woken by the queue: a waiter
// that looks while the key changes hands (the row gone, the named lock
// already with the next waiter) waits in line instead of taking the row
// without the named lock, which would leave the queue to poll behind it.
// 32 contenders (as make bench's hot-32), each with a Locker of its own,
// take turns for 2 s.
func TestHotKeyDoesNotBarge(t *testing.T) {
	dsn := testbed.MySQL(t)
	const contenders = 32
	lockers := make([]*mysqllock.Locker, contenders)
	for i := range lockers {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		lockers[i] = backends.NewMySQL(db, mysqllock.Config{}) // the default polls, as orderd's
		t.Cleanup(func() {
			lockers[i].Close()
			db.Close()
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	op := openDB(t, dsn)
	var grants, barged atomic.Int64
	stop := time.Now().Add(2 * time.Second)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range lockers {
		wg.Go(func() {
			<-gate
			for time.Now().Before(stop) {
				lease, err := l.Acquire(ctx, "sku/hot")
				if err != nil {
					t.Error(err)
					return
				}
				grants.Add(1)
				if !queued(t, op, lease) {
					barged.Add(1)
				}
				time.Sleep(100 * time.Microsecond)
				if err := lease.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	close(gate)
	wg.Wait()
	t.Logf("%d grants, %d without the named lock", grants.Load(), barged.Load())
	if n := grants.Load(); barged.Load()*20 > n {
		t.Errorf("%d of %d grants took the row without the named lock (barged past the queue)", barged.Load(), n)
	}
}
