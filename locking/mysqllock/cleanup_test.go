package mysqllock_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/internal/mysqllocktest"
)

// A grant won as the caller gives up is freed (mysqllocktest has the why).
func TestGrantAsCallerGivesUpIsFreed(t *testing.T) {
	mysqllocktest.GrantAsCallerGivesUpIsFreed(t, testbed.MySQL(t), table, lockerWithTTL)
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
	unlock, acquired := mysqllocktest.AcquireHeldUp(t, ctx, l, dsn, table, "sku/closing")
	closed := make(chan struct{})
	go func() {
		l.Close()
		close(closed)
	}()
	waitFor(t, func() bool { return mysqllock.Closed(l) })
	unlock()
	r := <-acquired
	<-closed
	if r.Err == nil {
		t.Errorf("Acquire during Close returned a lease (token %#x) and no error", r.Lease.Token())
	}
	if n := liveRows(t, openDB(t, dsn), "sku/closing"); n != 0 {
		t.Errorf("the grant that landed during Close keeps its row (%d): the key is blocked for a TTL", n)
	}
	t.Logf("Acquire during Close: %v", r.Err)
}

// table is the recipe's lease table.
const table = "oversold_locks"

// lockerWithTTL opens a recipe Locker of ttl on a pool of its own, both
// closed when the test ends.
func lockerWithTTL(t *testing.T, dsn string, ttl time.Duration) *mysqllock.Locker {
	t.Helper()
	l := mysqllock.New(openDB(t, dsn), mysqllock.Config{TTL: ttl})
	t.Cleanup(func() { l.Close() })
	return l
}

func liveRows(t *testing.T, db *sql.DB, key string) int {
	return mysqllocktest.LiveRows(t, db, table, key)
}

func openDB(t *testing.T, dsn string) *sql.DB { return mysqllocktest.OpenDB(t, dsn) }

func waitFor(t *testing.T, cond func() bool) { mysqllocktest.WaitFor(t, cond) }
