// Package mysqllocktest is test wiring, imported only by _test files: what
// the tests of the recipe (locking/mysqllock) and of its hardening packages
// (memtable, namedqueue, serverguard) share to run the conformance suite
// and their own tests on a real MariaDB. The recipe keeps its leases in
// table oversold_locks, the memtable in oversold_leases: helpers that read
// the table take its name. A team copying the recipe copies
// mysqllock_test.go with this package (or inlines the few helpers it uses).
package mysqllocktest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/mysqllock"
)

// Config is what the suite opens a Locker from.
type Config struct {
	DSN string
	TTL time.Duration
}

// Backend is the suite's description of the lock on the database of dsn,
// its leases in table. TakeOver hands the row to another owner for a
// minute, as a holder that took over after a pause would: the victim's next
// renewal matches no row; dropRival is the statement (with the key as its
// argument) that ends the rival's row again. Leftovers counts held rows.
func Backend(dsn, table, dropRival string) locktest.Backend[Config] {
	var (
		servers []string
		through func([]string) Config
	)
	if cfg, err := mysql.ParseDSN(dsn); err == nil && cfg.Net == "tcp" {
		servers = []string{cfg.Addr}
		through = func(addrs []string) Config {
			cfg.Addr = addrs[0]
			return Config{DSN: cfg.FormatDSN(), TTL: time.Second}
		}
	}
	return locktest.Backend[Config]{
		Name:   "mysql",
		Config: Config{DSN: dsn, TTL: time.Second},
		TTL:    time.Second,
		TakeOver: func(ctx context.Context, key string) (func(context.Context) error, error) {
			err := WithDB(ctx, dsn, func(db *sql.DB) error {
				res, err := db.ExecContext(ctx, `UPDATE `+table+`
					SET owner = 'rival', expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE
					WHERE lock_key = ? AND expires_at >= UTC_TIMESTAMP(6)`, key)
				if err != nil {
					return err
				}
				if n, err := res.RowsAffected(); err != nil || n != 1 {
					return fmt.Errorf("no held row for %q to take over (%d rows, %v)", key, n, err)
				}
				return nil
			})
			return func(ctx context.Context) error {
				return WithDB(ctx, dsn, func(db *sql.DB) error {
					_, err := db.ExecContext(ctx, dropRival, key)
					return err
				})
			}, err
		},
		Leftovers: func(ctx context.Context, key string) (n int, err error) {
			err = WithDB(ctx, dsn, func(db *sql.DB) error {
				return db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table+`
					WHERE lock_key = ? AND expires_at >= UTC_TIMESTAMP(6)`, key).Scan(&n)
			})
			return n, err
		},
		Servers: servers,
		Through: through,
	}
}

// WithDB runs f on a pool of its own, closed before it returns: a pool left
// open would show up in the suite's goroutine-leak check.
func WithDB(ctx context.Context, dsn string, f func(*sql.DB) error) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return f(db)
}

// OpenDB opens a pool on dsn, closed when the test ends.
func OpenDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// MustExec runs q on db, failing the test if it fails.
func MustExec(t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.ExecContext(t.Context(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// WaitFor polls cond until it holds, failing the test after 10 s.
func WaitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
	}
}

// LiveRows counts the key's rows in table whose lease has not run out.
func LiveRows(t *testing.T, db *sql.DB, table, key string) (n int) {
	t.Helper()
	if err := db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM `+table+`
WHERE lock_key = ? AND expires_at >= UTC_TIMESTAMP(6)`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Acquired is the result of an Acquire.
type Acquired struct {
	Lease locking.Lease
	Err   error
}

// AcquireHeldUp starts l.Acquire(ctx, key), l on the database of dsn with
// its leases in table, with its grab held up by a table lock, and returns
// once the grab waits for it: unlock lets it through, and the Acquire's
// result then comes on the channel. l has granted nothing yet; a first turn
// on another key makes the tables, the statements (and the hardened
// composition's idle queue connection).
func AcquireHeldUp(t *testing.T, ctx context.Context, l *mysqllock.Locker, dsn, table, key string) (unlock func(), result <-chan Acquired) {
	t.Helper()
	warm, err := l.Acquire(ctx, "warm")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other := OpenDB(t, dsn)
	blocker, err := other.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blocker.Close() })
	if _, err := blocker.ExecContext(t.Context(), "LOCK TABLES "+table+" WRITE"); err != nil {
		t.Fatal(err)
	}
	res := make(chan Acquired, 1)
	go func() {
		s, err := l.Acquire(ctx, key)
		res <- Acquired{s, err}
	}()
	WaitFor(t, func() bool { // the grab waits for the table lock
		var n int
		other.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM information_schema.PROCESSLIST
WHERE DB = DATABASE() AND INFO LIKE 'INSERT INTO `+table+`%' AND STATE LIKE '%lock%'`).Scan(&n)
		return n > 0
	})
	return func() {
		if _, err := blocker.ExecContext(t.Context(), "UNLOCK TABLES"); err != nil {
			t.Fatal(err)
		}
	}, res
}

// GrantAsCallerGivesUpIsFreed checks that a grant won as the caller gives
// up is freed: the grab statement is never abandoned halfway, so it can
// land just as ctx ends; its row must then be freed, or the key stays
// blocked for a whole TTL with nobody holding it. The grab is held up by a
// table lock until ctx has ended, then let through. locker opens a Locker
// of ttl on the database of dsn, its leases in table.
func GrantAsCallerGivesUpIsFreed(t *testing.T, dsn, table string, locker func(t *testing.T, dsn string, ttl time.Duration) *mysqllock.Locker) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const ttl = 30 * time.Second // a row left behind outlives every wait below
	l := locker(t, dsn, ttl)
	callerCtx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	unlock, acquired := AcquireHeldUp(t, callerCtx, l, dsn, table, "sku/given-up")
	giveUp()
	unlock()
	r := <-acquired
	if r.Err == nil {
		t.Fatalf("Acquire given up during its grab returned a lease (token %#x) and no error", r.Lease.Token())
	}
	if !errors.Is(r.Err, context.Canceled) {
		t.Errorf("Acquire given up during its grab: %v, want context.Canceled", r.Err)
	}
	if n := LiveRows(t, OpenDB(t, dsn), table, "sku/given-up"); n != 0 {
		t.Errorf("the grant won as the caller gave up keeps its row (%d): the key is blocked for a TTL", n)
	}
	rctx, rcancel := context.WithTimeout(ctx, ttl/2)
	defer rcancel()
	lease, err := locker(t, dsn, ttl).Acquire(rctx, "sku/given-up")
	if err != nil {
		t.Fatalf("a rival after the caller gave up: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// BenchAcquireRelease measures one uncontended acquire and release.
func BenchAcquireRelease(b *testing.B, l locking.Locker) {
	ctx := context.Background()
	for b.Loop() {
		lease, err := l.Acquire(ctx, "sku/bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchHotKey measures grants of one key among 8 contenders on l that ask
// again as soon as they release: handoffs/s counts every grant, and
// switches/s only those to a different contender than the previous one.
func BenchHotKey(b *testing.B, l locking.Locker) {
	ctx := context.Background()
	var (
		left     atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex // guards last, switches and first
		last     = -1
		switches int
		first    error
	)
	left.Store(int64(b.N))
	b.ResetTimer()
	began := time.Now()
	for w := range 8 {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				lease, err := l.Acquire(ctx, "sku/hot")
				if err == nil {
					mu.Lock()
					if last != w {
						last, switches = w, switches+1
					}
					mu.Unlock()
					err = lease.Release(ctx)
				}
				if err != nil {
					mu.Lock()
					first = err
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began).Seconds()
	b.ReportMetric(float64(b.N)/elapsed, "handoffs/s")
	b.ReportMetric(float64(switches)/elapsed, "switches/s")
	if first != nil {
		b.Fatal(first)
	}
}
