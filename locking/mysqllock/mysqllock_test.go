package mysqllock_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/internal/mysqllocktest"
)

// config is the suite's, shared with the hardening packages' tests.
type config = mysqllocktest.Config

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

// Rows stay (their tokens): a rival's row is given back by making it
// expired.
func TestConformance(t *testing.T) {
	locktest.Run(t, mysqllocktest.Backend(testbed.MySQL(t), "oversold_locks",
		`UPDATE oversold_locks SET expires_at = '1970-01-01' WHERE lock_key = ? AND owner = 'rival'`))
}

// BenchmarkAcquireRelease measures one uncontended acquire and release.
func BenchmarkAcquireRelease(b *testing.B) {
	mysqllocktest.BenchAcquireRelease(b, benchLocker(b))
}

// BenchmarkHotKey measures grants of one key among 8 contenders that ask
// again as soon as they release: handoffs/s counts every grant, and
// switches/s only those to a different contender than the previous one.
func BenchmarkHotKey(b *testing.B) {
	mysqllocktest.BenchHotKey(b, benchLocker(b))
}

func benchLocker(b *testing.B) locking.Locker {
	l, err := open(b.Context(), config{DSN: testbed.MySQL(b), TTL: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}
