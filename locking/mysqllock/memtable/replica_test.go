package memtable_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/serverguard"
)

// A primary with a GTID replica. The lease and boot tables are MEMORY
// tables: a replica's copies are empty after it restarts, so a
// release of a lease granted before the restart, were it in the binlog,
// would find no row there and stop replication (1032; it did before the
// fix). Then a failover to the replica: it has no boot row, so its first
// grant waits out the old holders' leases and its tokens lie above every
// token the primary gave (the epoch counter is replicated).
func TestReplicaRestartAndFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	binlog := func(id string) testbed.Options {
		return testbed.Options{Args: []string{"--log-bin=mysql-bin", "--server-id=" + id, "--binlog-format=MIXED", "--sync-binlog=1"}}
	}
	primary := locktest.PrivateServer(t, func(ctx context.Context, _ testbed.Options) (*testbed.Server, error) {
		return testbed.StartMariaDB(ctx, binlog("1"))
	})
	replica := locktest.PrivateServer(t, func(ctx context.Context, _ testbed.Options) (*testbed.Server, error) {
		return testbed.StartMariaDB(ctx, binlog("2"))
	})
	pdb := openDB(t, primary.DSN(""))
	rdb := openDB(t, replica.DSN(""))
	cfg, err := mysql.ParseDSN(primary.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(cfg.Addr, ":")
	mustExec(t, rdb, fmt.Sprintf("CHANGE MASTER TO MASTER_HOST='%s', MASTER_PORT=%s, MASTER_USER='root', MASTER_USE_GTID=slave_pos", host, port))
	mustExec(t, rdb, "START SLAVE")
	mustExec(t, pdb, "CREATE DATABASE locks")
	mustExec(t, pdb, "CREATE TABLE locks.marks (id INT PRIMARY KEY) ENGINE=InnoDB")
	mark := 0
	// caughtUp writes a row on the primary and waits for the replica to
	// apply it: replication runs, and everything before it arrived.
	caughtUp := func(rdb *sql.DB) {
		t.Helper()
		mark++
		mustExec(t, pdb, fmt.Sprintf("INSERT INTO locks.marks VALUES (%d)", mark))
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			var n int
			if rdb.QueryRowContext(ctx, "SELECT COUNT(*) FROM locks.marks WHERE id = ?", mark).Scan(&n) == nil && n == 1 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the replica did not apply mark %d: %s", mark, replicaStatus(t, rdb))
			}
		}
	}

	const ttl = 2 * time.Second
	// A pool whose statements reach the binlog is refused at the first
	// Acquire; OpenDB needs the privilege to keep them out, and says so.
	plain := backends.NewMySQL(openDB(t, primary.DSN("locks")), mysqllock.Config{TTL: ttl})
	if _, err := plain.Acquire(ctx, "sku/plain"); err == nil || !strings.Contains(err.Error(), "sql_log_bin=0") {
		t.Errorf("Acquire on a pool that logs: %v, want a refusal naming sql_log_bin=0", err)
	}
	plain.Close()
	mustExec(t, pdb, "CREATE USER 'locker'@'127.0.0.1'")
	mustExec(t, pdb, "GRANT ALL ON locks.* TO 'locker'@'127.0.0.1'")
	userCfg := cfg.Clone()
	userCfg.User, userCfg.DBName = "locker", "locks"
	if _, err := serverguard.OpenDB(ctx, userCfg.FormatDSN()); err == nil || !strings.Contains(err.Error(), "BINLOG ADMIN") {
		t.Errorf("OpenDB for a user who may not set sql_log_bin: %v, want an error naming BINLOG ADMIN", err)
	}
	mustExec(t, pdb, "GRANT BINLOG ADMIN ON *.* TO 'locker'@'127.0.0.1'")
	if db, err := serverguard.OpenDB(ctx, userCfg.FormatDSN()); err != nil {
		t.Errorf("OpenDB with BINLOG ADMIN: %v", err)
	} else {
		db.Close()
	}
	locker := func(dsn string) *mysqllock.Locker {
		db, err := serverguard.OpenDB(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		l := backends.NewMySQL(db, mysqllock.Config{TTL: ttl})
		t.Cleanup(func() {
			l.Close()
			db.Close()
		})
		return l
	}
	onPrimary := locker(primary.DSN("locks"))
	var before uint64
	held, err := onPrimary.Acquire(ctx, "sku/held")
	if err != nil {
		t.Fatal(err)
	}
	before = held.Token()
	caughtUp(rdb)

	// The replica restarts: its MEMORY tables come back empty.
	if err := replica.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := replica.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	rdb = openDB(t, replica.DSN(""))
	mustExec(t, rdb, "START SLAVE")
	other, err := onPrimary.Acquire(ctx, "sku/other")
	if err != nil {
		t.Fatal(err)
	}
	before = max(before, other.Token())
	for _, s := range []interface{ Release(context.Context) error }{other, held} {
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	stay, err := onPrimary.Acquire(ctx, "sku/failover")
	if err != nil {
		t.Fatal(err)
	}
	before = max(before, stay.Token())
	caughtUp(rdb) // fails before the fix: Last_SQL_Errno=1032
	noLeasesLogged(t, pdb)

	// Failover: the primary dies holding sku/failover; the replica is
	// promoted and serves the next grant.
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	mustExec(t, rdb, "STOP SLAVE")
	lease := takeOver(t, locker(replica.DSN("locks")), "sku/failover", stay, before, "the failover")
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// noLeasesLogged checks that the primary's binary log has no event on the
// MEMORY tables but their CREATE TABLE.
func noLeasesLogged(t *testing.T, db *sql.DB) {
	t.Helper()
	logs, err := db.QueryContext(t.Context(), "SHOW BINARY LOGS")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for logs.Next() {
		var name, size string
		if err := logs.Scan(&name, &size); err != nil {
			t.Fatal(err)
		}
		files = append(files, name)
	}
	logs.Close()
	events := 0
	for _, f := range files {
		rows, err := db.QueryContext(t.Context(), "SHOW BINLOG EVENTS IN '"+f+"'")
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(vals))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			events++
			info := vals[len(vals)-1].String
			if (strings.Contains(info, "oversold_leases") || strings.Contains(info, "oversold_lock_boot")) &&
				!strings.Contains(info, "CREATE TABLE") {
				t.Errorf("binlog %s has an event on a MEMORY table: %s: %s", f, vals[2].String, info)
			}
		}
		rows.Close()
	}
	if events == 0 {
		t.Fatal("no binlog events read")
	}
}

func replicaStatus(t *testing.T, db *sql.DB) string {
	rows, err := db.QueryContext(context.Background(), "SHOW SLAVE STATUS")
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	if !rows.Next() {
		return "no replica status"
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	rows.Scan(ptrs...)
	var out []string
	for i, c := range cols {
		switch c {
		case "Slave_IO_Running", "Slave_SQL_Running", "Last_SQL_Errno", "Last_SQL_Error":
			out = append(out, c+"="+vals[i].String)
		}
	}
	return strings.Join(out, " | ")
}
