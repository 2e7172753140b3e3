package namedqueue_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/mysqllock/namedqueue"
)

// A holder whose queue connection died while it held the key (a KILL by an
// operator or pt-kill, a proxy's reset) still frees the key on Release: the
// named lock died with the connection, and the row is deleted through the
// pool. Before, Release ran its DELETE on the dead
// connection only, failed, and the key stayed blocked for the rest of its
// lease (3.9 s of a 4 s TTL measured).
func TestReleaseAfterQueueConnectionKilled(t *testing.T) {
	dsn := testbed.MySQL(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const ttl = 30 * time.Second // far longer than any wait below: a row left behind fails the test
	lease, err := lockerWithTTL(t, dsn, ttl).Acquire(ctx, "sku/killed")
	if err != nil {
		t.Fatal(err)
	}
	if !queued(t, openDB(t, dsn), lease) {
		t.Fatal("the first grant of a free key did not take the named lock: no queue connection to kill")
	}
	op := openDB(t, dsn)
	var id sql.NullInt64
	if err := op.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", namedqueue.QueueName("sku/killed")).Scan(&id); err != nil || !id.Valid {
		t.Fatalf("the named lock's connection: %v, %v", id, err)
	}
	if _, err := op.ExecContext(ctx, "KILL CONNECTION ?", id.Int64); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { // the server has ended it
		var n int
		op.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", id.Int64).Scan(&n)
		return n == 0
	})
	if err := lease.Release(ctx); err != nil {
		t.Errorf("Release after its queue connection was killed: %v", err)
	}
	if n := liveRows(t, op, "sku/killed"); n != 0 {
		t.Errorf("the released key keeps its row (%d): blocked for the rest of its %v lease", n, ttl)
	}
	// A rival gets it without waiting for the lease to run out.
	rctx, rcancel := context.WithTimeout(ctx, ttl/2)
	defer rcancel()
	began := time.Now()
	r, err := lockerWithTTL(t, dsn, ttl).Acquire(rctx, "sku/killed")
	if err != nil {
		t.Fatalf("a rival after the release: %v", err)
	}
	t.Logf("the rival got the key %v after the release", time.Since(began).Round(time.Millisecond))
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
