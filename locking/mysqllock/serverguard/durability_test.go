package serverguard_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/serverguard"
)

// A server that may lose a commit in a crash is refused, by OpenDB and by
// a Locker's first Acquire: tokens keep growing across restarts only if the
// epoch bump survives one. Checked against a real
// MariaDB with the binary log on, its settings changed with SET GLOBAL
// (a private server: the shared one's settings are every test's).
func TestUndurableServerRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	admin, dsn := durableServer(t)
	accepted := func(when string) {
		t.Helper()
		db, err := serverguard.OpenDB(ctx, dsn)
		if err != nil {
			t.Fatalf("OpenDB %s: %v", when, err)
		}
		defer db.Close()
		l := backends.NewMySQL(db, mysqllock.Config{TTL: 3 * time.Second})
		defer l.Close()
		lease, err := l.Acquire(ctx, "sku/durable")
		if err != nil {
			t.Fatalf("Acquire %s: %v", when, err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	accepted("with durable commits")
	db, err := serverguard.OpenDB(ctx, dsn) // opened while the server is durable
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, c := range []struct{ set, restore, want string }{
		{"innodb_flush_log_at_trx_commit = 2", "innodb_flush_log_at_trx_commit = 1", "innodb_flush_log_at_trx_commit=1"},
		{"innodb_flush_log_at_trx_commit = 0", "innodb_flush_log_at_trx_commit = 1", "innodb_flush_log_at_trx_commit=1"},
		{"sync_binlog = 0", "sync_binlog = 1", "sync_binlog=1"},
	} {
		mustExec(t, admin, "SET GLOBAL "+c.set)
		if _, err := serverguard.OpenDB(ctx, dsn); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("OpenDB with %s: %v, want a refusal naming %s", c.set, err, c.want)
		}
		l := backends.NewMySQL(db, mysqllock.Config{TTL: 3 * time.Second})
		if lease, err := l.Acquire(ctx, "sku/durable"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("a Locker's first Acquire with %s: %v, want a refusal naming %s", c.set, err, c.want)
			if err == nil {
				lease.Release(ctx)
			}
		}
		l.Close()
		mustExec(t, admin, "SET GLOBAL "+c.restore)
	}
	accepted("after the settings were restored")
}

// A running Locker checks the settings again when it makes a new boot row:
// a restarted or promoted server may not have the settings its first
// Acquire saw. With sync_binlog set to 0 and the boot
// row gone (what a promoted replica looks like), the next Acquire is
// refused, naming the setting; before, it bumped the epoch and was granted.
func TestDurabilityCheckedAtEachBoot(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	admin, dsn := durableServer(t)
	db, err := serverguard.OpenDB(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l := backends.NewMySQL(db, mysqllock.Config{TTL: 3 * time.Second})
	defer l.Close()
	lease, err := l.Acquire(ctx, "sku/boot")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	defer mustExec(t, admin, "SET GLOBAL sync_binlog = 1")
	mustExec(t, admin, "SET GLOBAL sync_binlog = 0")
	mustExec(t, admin, "DELETE FROM locks.oversold_lock_boot")
	lease, err = l.Acquire(ctx, "sku/boot")
	if err == nil || !strings.Contains(err.Error(), "sync_binlog=1") {
		t.Errorf("Acquire after a new server run with sync_binlog=0: %v, want a refusal naming sync_binlog=1", err)
		if err == nil {
			lease.Release(ctx)
		}
	}
}

// durableServer starts a private MariaDB with the binary log on and
// durable settings (the shared server's globals are every test's), and
// returns a root connection and the DSN of its database locks.
func durableServer(t *testing.T) (admin *sql.DB, dsn string) {
	t.Helper()
	srv := locktest.PrivateServer(t, func(ctx context.Context, _ testbed.Options) (*testbed.Server, error) {
		return testbed.StartMariaDB(ctx, testbed.Options{Args: []string{"--log-bin=mysql-bin", "--server-id=1", "--sync-binlog=1"}})
	})
	admin = openDB(t, srv.DSN(""))
	mustExec(t, admin, "CREATE DATABASE locks")
	return admin, srv.DSN("locks")
}
