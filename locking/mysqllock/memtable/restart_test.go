package memtable_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/mysqllock"
)

// The leases live in memory: a crash of MariaDB (SIGKILL) forgets them.
// Tokens after it must still be larger than every token before it (the
// epoch, bumped durably once per server run), and the key must not go to
// anyone before the holder from before the crash has seen its Lost close
// (the grace of one TTL after the restart). Without the grace the rival is
// granted milliseconds after the restart while the holder, whose renewals
// come every TTL/3, still believes it holds; with the epoch kept in memory
// the rival's token starts again at 1<<40 | 1.
func TestRestartKeepsTokensAndExclusion(t *testing.T) {
	srv, dsn := privateDatabase(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const ttl = 6 * time.Second
	holder, rival := lockerWithTTL(t, dsn, ttl), lockerWithTTL(t, dsn, ttl)
	var before uint64
	for range 3 { // tokens of released grants count too
		lease, err := holder.Acquire(ctx, "sku/other")
		if err != nil {
			t.Fatal(err)
		}
		before = max(before, lease.Token())
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held, err := holder.Acquire(ctx, "sku/restart")
	if err != nil {
		t.Fatal(err)
	}
	before = max(before, held.Token())

	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	lease := takeOver(t, rival, "sku/restart", held, before, "the restart")
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The holder from before the crash: its lease is gone.
	if err := held.Release(ctx); err == nil {
		t.Error("Release of the lease from before the crash succeeded")
	}
	// And a new grant of the key continues the new run's tokens.
	again, err := holder.Acquire(ctx, "sku/restart")
	if err != nil {
		t.Fatal(err)
	}
	if again.Token() <= lease.Token() {
		t.Errorf("token %#x after %#x", again.Token(), lease.Token())
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// takeOver acquires key with rival after the server holder's lease was
// granted on went away (a restart, a failover), and checks the grant: not
// before held's Lost closed, and a token above before. It returns the
// lease.
func takeOver(t *testing.T, rival *mysqllock.Locker, key string, held locking.Lease, before uint64, after string) locking.Lease {
	t.Helper()
	start := time.Now()
	lease, err := rival.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	select {
	case <-held.Lost():
	default:
		t.Errorf("the rival was granted the key %v after %s while the holder from before it still held it (Lost open)",
			granted.Sub(start).Round(time.Millisecond), after)
	}
	if lease.Token() <= before {
		t.Errorf("token after %s %#x, not above the %#x granted before it", after, lease.Token(), before)
	}
	t.Logf("granted %v after %s; tokens up to %#x before, %#x after", granted.Sub(start).Round(time.Millisecond), after, before, lease.Token())
	return lease
}

// privateDatabase starts a MariaDB of the test's own (one it may kill, or
// whose global counters are the test's alone) and returns it with the DSN
// of an empty database on it.
func privateDatabase(t *testing.T) (*testbed.Server, string) {
	t.Helper()
	srv := locktest.PrivateServer(t, testbed.StartMariaDB)
	db, err := sql.Open("mysql", srv.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(t.Context(), "CREATE DATABASE locks"); err != nil {
		t.Fatal(err)
	}
	return srv, srv.DSN("locks")
}
