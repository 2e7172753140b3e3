package memtable_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/mysqllock"
)

// An uncontended Acquire and Release cost what GET_LOCK and RELEASE_LOCK
// cost: two statements, and nothing written to the redo log. On a private
// server, so that the global counters are this test's alone. The lock
// table in InnoDB cost three statements and two flushed commits a turn.
func TestUncontendedTurnCosts(t *testing.T) {
	srv, dsn := privateDatabase(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	db, err := sql.Open("mysql", srv.DSN("")) // for the server's counters
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ldb, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer ldb.Close()
	l := backends.NewMySQL(ldb, mysqllock.Config{TTL: time.Minute})
	defer l.Close()
	turn := func(key string) {
		lease, err := l.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	turn("warm") // tables, epoch, prepared statements, a queue connection
	counters := func() map[string]int {
		rows, err := db.QueryContext(ctx, `SHOW GLOBAL STATUS WHERE Variable_name IN
			('Com_stmt_execute', 'Innodb_log_writes', 'Innodb_os_log_fsyncs', 'Innodb_data_fsyncs')`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		m := map[string]int{}
		for rows.Next() {
			var k, v string
			if err := rows.Scan(&k, &v); err != nil {
				t.Fatal(err)
			}
			m[k], _ = strconv.Atoi(v)
		}
		return m
	}
	const n = 50
	before := counters()
	for i := range n {
		turn(fmt.Sprintf("key/%d", i))
	}
	after := counters()
	per := func(k string) float64 { return float64(after[k]-before[k]) / n }
	t.Logf("per turn: %.2f statements, %.2f log writes, %.2f log fsyncs, %.2f data fsyncs",
		per("Com_stmt_execute"), per("Innodb_log_writes"), per("Innodb_os_log_fsyncs"), per("Innodb_data_fsyncs"))
	if s := per("Com_stmt_execute"); s > 2 {
		t.Errorf("%.2f statements per uncontended turn, want 2 (GET_LOCK and RELEASE_LOCK's)", s)
	}
	for _, k := range []string{"Innodb_log_writes", "Innodb_os_log_fsyncs", "Innodb_data_fsyncs"} {
		if w := per(k); w > 0.2 { // InnoDB's own background writes, not one per turn
			t.Errorf("%s: %.2f per uncontended turn, want none", k, w)
		}
	}
}
