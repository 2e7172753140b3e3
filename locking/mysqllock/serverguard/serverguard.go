// Package serverguard refuses MySQL servers the mysql lock cannot keep
// its promises on, and opens its pool: Galera and Group Replication (no
// exclusion on MEMORY tables), a server that may lose a commit in a crash
// (the token's epoch would repeat), and a pool whose statements would
// reach the binary log (a replica's restart would stop replication).
// Reasoning: docs/locks/mysql.md.
package serverguard

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/locking"
)

// The server the lock runs on. Supported: one primary, with or without
// asynchronous replicas. The leases and the boot row are MEMORY tables,
// which must stay out of the binary log: a replica's copies are empty after
// it restarts, and the primary's DELETE of a lease granted before that
// restart finds no row there and stops replication (error 1032). So the
// lock's connections run with sql_log_bin=0 when the server logs (OpenDB);
// only the table definitions and the durable epoch counter (InnoDB) are
// logged (logged). A promoted replica then has no boot row: its first
// grab bumps the epoch it replicated and waits one TTL, as after a restart.
// Galera replicates no MEMORY table (each node would grant every key on
// its own) and Group Replication refuses writes to one: both are refused.

// erAccessDenied is ER_SPECIFIC_ACCESS_DENIED_ERROR: no privilege to set
// sql_log_bin.
const erAccessDenied = 1227

// OpenDB opens the pool a Locker runs on, for dsn (go-sql-driver), checks
// that the server answers and is a supported topology, and keeps the
// lock's statements out of the binary log when the server logs: the DSN
// then gets sql_log_bin=0, which every connection sets as it opens. That
// needs the SUPER or BINLOG ADMIN privilege on MariaDB, SUPER,
// SYSTEM_VARIABLES_ADMIN or SESSION_VARIABLES_ADMIN on MySQL 8; without it
// OpenDB fails saying so. A server that does not answer is an error
// wrapping locking.ErrUnavailable.
func OpenDB(ctx context.Context, dsn string) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	db, err := openPool(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var logs bool
	if err := db.QueryRowContext(ctx, `SELECT @@GLOBAL.log_bin AND @@SESSION.sql_log_bin`).Scan(&logs); err != nil {
		db.Close()
		return nil, fmt.Errorf("%w: %w", locking.ErrUnavailable, err)
	}
	if logs {
		db.Close()
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["sql_log_bin"] = "0"
		var myErr *mysql.MySQLError
		if db, err = openPool(ctx, cfg); errors.As(err, &myErr) && myErr.Number == erAccessDenied {
			return nil, fmt.Errorf("the binary log is on and the lock must keep its MEMORY tables out of it, "+
				"but its user may not SET sql_log_bin=0: grant it BINLOG ADMIN (MariaDB) or "+
				"SESSION_VARIABLES_ADMIN (MySQL 8): %w", err)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := CheckServer(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// openPool opens and pings a pool sized for a Locker.
func openPool(ctx context.Context, cfg *mysql.Config) (*sql.DB, error) {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	// Waiters poll together: with database/sql's default of 2 idle
	// connections most polls would reconnect and re-prepare. The cap
	// bounds what a crowd of waiters costs the shared database.
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	db.SetConnMaxIdleTime(time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		var myErr *mysql.MySQLError
		if errors.As(err, &myErr) {
			return nil, err // the server answered: a setting, not an outage
		}
		return nil, fmt.Errorf("%w: %w", locking.ErrUnavailable, err)
	}
	return db, nil
}

// CheckServer refuses a topology the lock cannot keep exclusion on, a
// server that may lose a commit in a crash, and a pool whose statements
// would reach the binary log.
func CheckServer(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, `SHOW GLOBAL VARIABLES
WHERE Variable_name IN ('wsrep_on', 'group_replication_group_name',
	'innodb_flush_log_at_trx_commit', 'log_bin', 'sync_binlog')`)
	if err != nil {
		return err
	}
	defer rows.Close()
	vars := map[string]string{}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return err
		}
		vars[name] = value
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var logs bool
	if err := db.QueryRowContext(ctx, `SELECT @@GLOBAL.log_bin AND @@SESSION.sql_log_bin`).Scan(&logs); err != nil {
		return err
	}
	return CheckSettings(vars, logs)
}

// CheckSettings is CheckServer's decision, from the server's global
// variables (SHOW GLOBAL VARIABLES: wsrep_on and
// group_replication_group_name, absent when not there;
// innodb_flush_log_at_trx_commit, log_bin, sync_binlog) and whether the
// pool's statements are logged.
//
// Tokens keep growing across restarts only if the epoch bump survives a
// crash (docs/locks/mysql.md, "Token"): a lost bump is made again with the same
// number, and the lost run's tokens are handed out a second time, below
// fences written meanwhile (409s until seq passes them) or equal to
// them. So commits must be flushed: innodb_flush_log_at_trx_commit 1 (the
// default) or 3 (MariaDB); 0 loses the last second in a crash of mysqld, 2
// in one of the host. With the binary log on, MariaDB recovers a commit
// from the binlog (it does not flush InnoDB's commit record), and MySQL
// rolls back a prepared transaction its binlog lacks: sync_binlog must be
// 1 (MySQL 8's default, not MariaDB's).
func CheckSettings(vars map[string]string, logs bool) error {
	flush := vars["innodb_flush_log_at_trx_commit"]
	switch {
	case vars["wsrep_on"] == "ON":
		return errors.New("Galera (wsrep_on=ON) is not supported: the lease table is a MEMORY table, which Galera does not replicate, " +
			"so every node would grant the same key; use one primary with asynchronous replicas")
	case vars["group_replication_group_name"] != "":
		return errors.New("Group Replication is not supported: it refuses writes to the lease table, a MEMORY table; " +
			"use one primary with asynchronous replicas")
	case flush != "1" && flush != "3":
		return fmt.Errorf("innodb_flush_log_at_trx_commit=%s: the lock's epoch, which keeps tokens growing across restarts, "+
			"could be lost in a crash and tokens repeat; set innodb_flush_log_at_trx_commit=1 (the default)", flush)
	case vars["log_bin"] == "ON" && vars["sync_binlog"] != "1":
		return fmt.Errorf("sync_binlog=%s with the binary log on: a commit survives a crash of the host only once its binlog event is synced, "+
			"so the lock's epoch could be lost and tokens repeat; set sync_binlog=1", vars["sync_binlog"])
	case logs:
		return errors.New("the binary log is on and the pool's statements are logged: the lock's MEMORY tables must stay out of it " +
			"(a replica restart would stop replication); open the pool with serverguard.OpenDB, or add sql_log_bin=0 to the DSN")
	}
	return nil
}

// LogOn turns binary logging on for conn, if the pool turned it off, for a
// statement replicas must see (the tables' definitions, the durable epoch);
// restore turns it off again, or discards conn if it cannot.
func LogOn(ctx context.Context, conn *sql.Conn) (restore func() error, err error) {
	var on bool
	if err := conn.QueryRowContext(ctx, `SELECT @@SESSION.sql_log_bin`).Scan(&on); err != nil {
		return nil, err
	}
	if on {
		return func() error { return nil }, nil
	}
	if _, err := conn.ExecContext(ctx, `SET SESSION sql_log_bin = 1`); err != nil {
		return nil, err
	}
	return func() error {
		_, err := conn.ExecContext(ctx, `SET SESSION sql_log_bin = 0`)
		if err != nil {
			// Never give a logging connection back to the pool.
			conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		return err
	}, nil
}
