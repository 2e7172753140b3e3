package memtable_test

import (
	"context"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/memtable"
)

// The table works under the recipe's own polling Line too, not only under
// namedqueue: its Try learns a new server run's epoch itself (here the
// database's first), so the first Acquire is granted after a poll instead
// of failing on every try until ctx ends; a later grant of the key has a
// larger token.
func TestTableUnderPollingLine(t *testing.T) {
	db := openDB(t, testbed.MySQL(t))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const ttl = 5 * time.Second
	l := mysqllock.New(db, mysqllock.Config{TTL: ttl, Table: memtable.New(db, ttl)})
	defer l.Close()
	var last uint64
	for range 2 {
		lease, err := l.Acquire(ctx, "sku/polled")
		if err != nil {
			t.Fatalf("Acquire through the polling Line: %v", err)
		}
		if lease.Token() <= last {
			t.Errorf("token %#x after %#x", lease.Token(), last)
		}
		last = lease.Token()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
