package mysqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/mysqllock"
)

// config is what the suite opens a Locker from.
type config struct {
	DSN string
	TTL time.Duration
}

// open is how the suite opens the recipe alone, here and in its helper
// processes: a plain pool, the default table and polling.
func open(ctx context.Context, c config) (locking.Locker, error) {
	db, err := sql.Open("mysql", c.DSN)
	if err != nil {
		return nil, err
	}
	return locktest.Closing(mysqllock.New(db, mysqllock.Config{TTL: c.TTL}), db.Close), nil
}

func TestMain(m *testing.M) { locktest.Main(m, open) }

func TestConformance(t *testing.T) {
	dsn := testbed.MySQL(t)
	var (
		servers []string
		through func([]string) config
	)
	if cfg, err := mysql.ParseDSN(dsn); err == nil && cfg.Net == "tcp" {
		servers = []string{cfg.Addr}
		through = func(addrs []string) config {
			cfg.Addr = addrs[0]
			return config{DSN: cfg.FormatDSN(), TTL: time.Second}
		}
	}
	locktest.Run(t, locktest.Backend[config]{
		Name:   "mysql",
		Config: config{DSN: dsn, TTL: time.Second},
		TTL:    time.Second,
		// Hand the row to another owner for a minute, as a holder that took
		// over after a pause would: the victim's next renewal matches no row.
		TakeOver: func(ctx context.Context, key string) (func(context.Context) error, error) {
			err := withDB(ctx, dsn, func(db *sql.DB) error {
				res, err := db.ExecContext(ctx, `UPDATE oversold_locks
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
				return withDB(ctx, dsn, func(db *sql.DB) error {
					_, err := db.ExecContext(ctx, `UPDATE oversold_locks SET expires_at = '1970-01-01' WHERE lock_key = ? AND owner = 'rival'`, key)
					return err
				})
			}, err
		},
		// Rows stay (their tokens): count held ones.
		Leftovers: func(ctx context.Context, key string) (n int, err error) {
			err = withDB(ctx, dsn, func(db *sql.DB) error {
				return db.QueryRowContext(ctx, `SELECT COUNT(*) FROM oversold_locks
					WHERE lock_key = ? AND expires_at >= UTC_TIMESTAMP(6)`, key).Scan(&n)
			})
			return n, err
		},
		Servers: servers,
		Through: through,
	})
}

// withDB runs f on a pool of its own, closed before it returns: a pool left
// open would show up in the suite's goroutine-leak check.
func withDB(ctx context.Context, dsn string, f func(*sql.DB) error) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return f(db)
}

// BenchmarkAcquireRelease measures one uncontended acquire and release.
func BenchmarkAcquireRelease(b *testing.B) {
	l, err := open(b.Context(), config{DSN: testbed.MySQL(b), TTL: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
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

// BenchmarkHotKey measures grants of one key among 8 contenders that ask
// again as soon as they release: handoffs/s counts every grant, and
// switches/s only those to a different contender than the previous one.
func BenchmarkHotKey(b *testing.B) {
	l, err := open(b.Context(), config{DSN: testbed.MySQL(b), TTL: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
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
