package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/locking"
)

// RowsTable is the recipe's table. Keys are bytes compared exactly
// (VARBINARY): a case-insensitive collation would merge keys. Rows stay
// after Release, so a key's token never starts again; InnoDB keeps it
// across a crash when commits are flushed (innodb_flush_log_at_trx_commit=1,
// the default).
const RowsTable = "oversold_locks"

const createRows = `CREATE TABLE IF NOT EXISTS oversold_locks (
	lock_key   VARBINARY(255)  NOT NULL PRIMARY KEY,
	owner      CHAR(32) CHARACTER SET ascii NOT NULL,
	token      BIGINT UNSIGNED NOT NULL,
	expires_at DATETIME(6)     NOT NULL
) ENGINE=InnoDB`

// tryRow takes the key's row if it is new, free or expired, in one
// statement, and hands the token back as the insert id: LAST_INSERT_ID(1)
// for a new row, token + 1 for a taken-over one, and 0 (set explicitly,
// since the VALUES list already set 1) when someone holds the key. The
// assignments run left to right, each seeing the old expires_at.
// Args: key, owner, ttl µs.
const tryRow = `INSERT INTO oversold_locks (lock_key, owner, token, expires_at)
VALUES (?, ?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
	token = IF(expires_at < UTC_TIMESTAMP(6), LAST_INSERT_ID(token + 1), token + LAST_INSERT_ID(0)),
	owner = IF(expires_at < UTC_TIMESTAMP(6), VALUES(owner), owner),
	expires_at = IF(expires_at < UTC_TIMESTAMP(6), VALUES(expires_at), expires_at)`

// renewRow extends only our own unexpired lease. Args: ttl µs, key, owner.
const renewRow = `UPDATE oversold_locks SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE lock_key = ? AND owner = ? AND expires_at >= UTC_TIMESTAMP(6)`

// freeRow expires our own unexpired lease, keeping the row's token.
// Args: key, owner.
const freeRow = `UPDATE oversold_locks SET expires_at = '1970-01-01'
WHERE lock_key = ? AND owner = ? AND expires_at >= UTC_TIMESTAMP(6)`

// erDeadlock: InnoDB chose this grab as a deadlock victim (concurrent
// first grabs of a new key); nothing was done, the key is someone's.
const erDeadlock = 1213

// rows is the recipe's Table: one InnoDB row per key ever locked. The
// Locker calls Prepare and Close under its prepMu.
type rows struct {
	db               *sql.DB
	ttl              time.Duration
	try, renew, free *sql.Stmt // prepared once: one round trip each
}

func (r *rows) Prepare(ctx context.Context) error {
	if _, err := r.db.ExecContext(ctx, createRows); err != nil {
		return err
	}
	var err error
	prep := func(q string) *sql.Stmt {
		var st *sql.Stmt
		if err == nil {
			st, err = r.db.PrepareContext(ctx, q)
		}
		return st
	}
	r.try, r.renew, r.free = prep(tryRow), prep(renewRow), prep(freeRow)
	if err != nil {
		r.Close()
	}
	return err
}

func (r *rows) Try(ctx context.Context, key, owner string) (uint64, error) {
	res, err := r.try.ExecContext(ctx, key, owner, r.ttl.Microseconds())
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) && myErr.Number == erDeadlock {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	token, err := res.LastInsertId()
	return uint64(token), err
}

func (r *rows) Renew(ctx context.Context, key, owner string) error {
	return RowsOrNotHeld(r.renew.ExecContext(ctx, r.ttl.Microseconds(), key, owner))
}

func (r *rows) Free(ctx context.Context, key, owner string) error {
	return RowsOrNotHeld(r.free.ExecContext(ctx, key, owner))
}

func (r *rows) Close() error {
	for _, st := range []*sql.Stmt{r.try, r.renew, r.free} {
		if st != nil {
			st.Close()
		}
	}
	return nil
}

// RowsOrNotHeld maps an UPDATE or DELETE that matched no row to
// ErrNotHeld. A renewal always changes the row it matches (a new expiry),
// so the count is the same with or without the clientFoundRows DSN option.
func RowsOrNotHeld(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return locking.ErrNotHeld
	}
	return nil
}
