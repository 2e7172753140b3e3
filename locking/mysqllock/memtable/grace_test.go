package memtable_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/testbed"
)

// The grace after a restart covers the longest TTL of any Locker on the
// database, not only the TTL of the Locker that makes the boot row: during
// a rolling change of the TTL, a holder of 10 s must have seen its Lost
// close before a Locker of 1 s is granted its key.
// The holder is cut off from the server at the restart (its connections
// go through a proxy that then refuses them), as a paused or partitioned
// holder would be, so its Lost closes only when its own lease runs out.
// Before, the rival was granted about 1 s after the restart.
func TestRestartGraceCoversLongestTTL(t *testing.T) {
	srv, dsn := privateDatabase(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const long, short = 10 * time.Second, time.Second
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := testbed.StartProxy("mysql-long-ttl", cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	cfg.Addr = proxy.Addr()
	holder, rival := lockerWithTTL(t, cfg.FormatDSN(), long), lockerWithTTL(t, dsn, short)
	// The rival runs before the restart too: the longest TTL is what any
	// Locker announced, whichever makes the boot row.
	lease, err := rival.Acquire(ctx, "sku/other")
	if err != nil {
		t.Fatal(err)
	}
	before := lease.Token()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	held, err := holder.Acquire(ctx, "sku/grace")
	if err != nil {
		t.Fatal(err)
	}
	before = max(before, held.Token())
	proxy.Refuse()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	lease = takeOver(t, rival, "sku/grace", held, before, "the restart")
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
