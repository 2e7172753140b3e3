package namedqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/internal/mysqllocktest"
	"github.com/oversold-lab/oversold/locking/mysqllock/serverguard"
)

// config is the suite's, shared with the recipe's tests.
type config = mysqllocktest.Config

// open is how the suite opens the hardened composition (backends.NewMySQL),
// here and in its helper processes: a pool of its own, sized for the lock,
// its statements kept out of the binary log, the server checked (OpenDB).
func open(ctx context.Context, c config) (locking.Locker, error) {
	db, err := serverguard.OpenDB(ctx, c.DSN)
	if err != nil {
		return nil, err
	}
	return locktest.Closing(backends.NewMySQL(db, mysqllock.Config{TTL: c.TTL}), db.Close), nil
}

func TestMain(m *testing.M) { locktest.Main(m, open) }

// A dead holder's row stays until the key is taken again; a rival's row
// is deleted.
func TestConformance(t *testing.T) {
	locktest.Run(t, mysqllocktest.Backend(testbed.MySQL(t), "oversold_leases",
		`DELETE FROM oversold_leases WHERE lock_key = ? AND owner = 'rival'`))
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
