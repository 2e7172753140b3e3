package memtable_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/internal/mysqllocktest"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// lockerWithTTL opens the hardened Locker (backends.NewMySQL) of ttl on a
// pool of its own, both closed when the test ends.
func lockerWithTTL(t *testing.T, dsn string, ttl time.Duration) *mysqllock.Locker {
	t.Helper()
	l := backends.NewMySQL(openDB(t, dsn), mysqllock.Config{TTL: ttl})
	t.Cleanup(func() { l.Close() })
	return l
}

func openDB(t *testing.T, dsn string) *sql.DB { return mysqllocktest.OpenDB(t, dsn) }

func mustExec(t *testing.T, db *sql.DB, q string) { mysqllocktest.MustExec(t, db, q) }

func waitFor(t *testing.T, cond func() bool) { mysqllocktest.WaitFor(t, cond) }
