// Package memtable keeps the mysql lock's leases in a MEMORY table, so a
// grant and a release write nothing to disk (a plain GET_LOCK writes
// nothing either), with tokens that still grow across server restarts.
//
// It is a mysqllock.Table: one row per held key in oversold_leases (lock_key,
// owner, seq, epoch, expires_at), every time from the database's clock.
// Token = epoch << 40 | seq: seq is the table's AUTO_INCREMENT, which grows
// with every grant while the server runs; epoch counts server runs, bumped
// durably (InnoDB, flushed) once per run before the run's first grant. A
// MEMORY table is empty after a restart: no key is granted for the longest
// TTL any Locker announced, so every holder from before it has seen its
// Lost close first. A table full of expired rows is swept. The server must
// flush commits (serverguard checks it at each new run).
//
// What it buys: an uncontended turn costs two statements and no redo-log
// flush (TestUncontendedTurnCosts), against the recipe's flushed InnoDB
// commit per grant and per release. Long reasoning, failure modes and
// peers: docs/locks/mysql.md.
package memtable

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/serverguard"
)

var _ mysqllock.Table = (*Table)(nil)

// Name is the lease table's name. It and the epoch tables are created on
// first use.
const Name = "oversold_leases"

// seqBits is the width of seq in a token; the epoch is above it.
const seqBits = 40

// Keys are bytes compared exactly (VARBINARY): a case-insensitive or
// pad-space collation would merge keys that differ only in case or in
// trailing spaces. Concurrent CREATE TABLE IF NOT EXISTS is safe: the
// server serialises it on the table name's metadata lock. Only the epoch
// counter is durable (InnoDB); the leases and the boot row are in memory.
var createTables = []string{
	`CREATE TABLE IF NOT EXISTS oversold_leases (
	lock_key   VARBINARY(255)  NOT NULL PRIMARY KEY,
	seq        BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
	epoch      BIGINT UNSIGNED NOT NULL,
	owner      CHAR(32) CHARACTER SET ascii NOT NULL,
	expires_at DATETIME(6)     NOT NULL,
	KEY (seq)
) ENGINE=MEMORY`,
	`CREATE TABLE IF NOT EXISTS oversold_lock_epochs (
	id    TINYINT UNSIGNED NOT NULL PRIMARY KEY,
	epoch BIGINT UNSIGNED  NOT NULL
) ENGINE=InnoDB`,
	`INSERT IGNORE INTO oversold_lock_epochs (id, epoch) VALUES (1, 0)`,
	`CREATE TABLE IF NOT EXISTS oversold_lock_max_ttl (
	id     TINYINT UNSIGNED NOT NULL PRIMARY KEY,
	ttl_us BIGINT UNSIGNED  NOT NULL
) ENGINE=InnoDB`,
	`INSERT IGNORE INTO oversold_lock_max_ttl (id, ttl_us) VALUES (1, 0)`,
	`CREATE TABLE IF NOT EXISTS oversold_lock_boot (
	id          TINYINT UNSIGNED NOT NULL PRIMARY KEY,
	epoch       BIGINT UNSIGNED  NOT NULL,
	grace_until DATETIME(6)      NOT NULL
) ENGINE=MEMORY`,
}

// grab inserts the key's row, stamped with the caller's epoch: the
// subquery is NULL, which the NOT NULL column refuses (erBadNull), unless
// the boot row names that epoch and its grace is over. The AUTO_INCREMENT
// seq comes back as the insert id. A held key's row makes it fail with
// erDupEntry. Args: key, epoch, owner, ttl µs.
const grab = `INSERT INTO oversold_leases (lock_key, epoch, owner, expires_at)
VALUES (?, (SELECT epoch FROM oversold_lock_boot WHERE id = 1 AND epoch = ? AND epoch > 0 AND grace_until <= UTC_TIMESTAMP(6)),
	?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`

// dropExpired deletes the key's row if its lease ran out. Args: key.
const dropExpired = `DELETE FROM oversold_leases WHERE lock_key = ? AND expires_at < UTC_TIMESTAMP(6)`

// sweep deletes a batch of rows whose lease ran out (dead holders',
// released ones the database never saw), when the table is full: each is
// what dropExpired would delete on the key's next grab.
const sweep = `DELETE FROM oversold_leases WHERE expires_at < UTC_TIMESTAMP(6) LIMIT 1000`

// renew extends only our own unexpired lease. Args: ttl µs, key, owner.
const renew = `UPDATE oversold_leases SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE lock_key = ? AND owner = ? AND expires_at >= UTC_TIMESTAMP(6)`

// free gives up our own unexpired lease. Args: key, owner.
const free = `DELETE FROM oversold_leases WHERE lock_key = ? AND owner = ? AND expires_at >= UTC_TIMESTAMP(6)`

// The epoch of this server run (package doc).
const (
	// readBoot: the run's epoch and the grace left, in µs.
	readBoot = `SELECT epoch, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), grace_until)
FROM oversold_lock_boot WHERE id = 1`
	// placeBoot makes the run's boot row, epoch 0 (no grab matches it)
	// until a bumped epoch is set. The first of a run is made before any
	// bump of the run, so it reads the epoch the previous runs left: 0
	// when there was none, and then no lease to wait out. The grace is
	// the longest TTL any Locker announced (announceTTL), so that a holder
	// of a longer TTL than ours has seen its Lost close too. Args: our
	// TTL µs.
	placeBoot = `INSERT IGNORE INTO oversold_lock_boot (id, epoch, grace_until)
SELECT 1, 0, IF(e.epoch > 0, UTC_TIMESTAMP(6) + INTERVAL GREATEST(?, COALESCE(t.ttl_us, 0)) MICROSECOND, '1970-01-01')
FROM oversold_lock_epochs e LEFT JOIN oversold_lock_max_ttl t ON t.id = 1 WHERE e.id = 1`
	// announceTTL raises the longest TTL to ours, durably, before the
	// Locker's first grab. It is never lowered: a Locker of a longer
	// TTL may still hold a key. Args: TTL µs, TTL µs.
	announceTTL = `UPDATE oversold_lock_max_ttl SET ttl_us = ? WHERE id = 1 AND ttl_us < ?`
	bumpEpoch   = `UPDATE oversold_lock_epochs SET epoch = LAST_INSERT_ID(epoch + 1) WHERE id = 1`
	// setBoot hands a bumped epoch out, unless another Locker's already
	// is. Args: epoch.
	setBoot = `UPDATE oversold_lock_boot SET epoch = ? WHERE id = 1 AND epoch = 0`
)

// MySQL error numbers the grab expects.
const (
	erDupEntry = 1062 // ER_DUP_ENTRY: the key's row exists
	erBadNull  = 1048 // ER_BAD_NULL_ERROR: our epoch is not the run's (grab)
	erFull     = 1114 // ER_RECORD_FILE_FULL: max_heap_table_size reached
)

// Swept handles a grab's error: when the lease table is full, it deletes
// a batch of expired rows and says whether to try the grab again (once,
// the first time); else it leaves err alone.
func (l *Table) Swept(ctx context.Context, err error, try int) (bool, error) {
	var myErr *mysql.MySQLError
	if !errors.As(err, &myErr) || myErr.Number != erFull {
		return false, err
	}
	if try == 0 {
		if _, serr := l.stmts.Load().sweep.ExecContext(ctx); serr != nil {
			return false, errors.Join(err, serr)
		}
		return true, nil
	}
	return false, fmt.Errorf("lease table full of live leases (its size is max_heap_table_size at its creation): %w", err)
}

// Table is the MEMORY lease table with epoch tokens. It is safe for
// concurrent use.
type Table struct {
	db  *sql.DB
	ttl time.Duration

	stmts   atomic.Pointer[statements] // set by Prepare
	epochMu sync.Mutex                 // one LearnEpoch at a time
	epoch   atomic.Uint64              // this server run's, as last learned; 0: not yet
}

// statements are prepared once, so each costs one round trip: unprepared,
// go-sql-driver prepares, runs and closes every statement with arguments.
type statements struct {
	grab, dropExpired, renew, free, sweep *sql.Stmt
}

func (s *statements) close() {
	for _, stmt := range []*sql.Stmt{s.grab, s.dropExpired, s.renew, s.free, s.sweep} {
		if stmt != nil {
			stmt.Close()
		}
	}
}

// New returns the table on db (a pool opened by serverguard.OpenDB) for
// leases of ttl, the Locker's TTL.
func New(db *sql.DB, ttl time.Duration) *Table { return &Table{db: db, ttl: ttl} }

// DB is the pool the table runs on.
func (l *Table) DB() *sql.DB { return l.db }

// TTL is the lease time to live the table grants.
func (l *Table) TTL() time.Duration { return l.ttl }

// Epoch is this server run's epoch, as last learned (0: not yet).
func (l *Table) Epoch() uint64 { return l.epoch.Load() }

// Prepare checks the server, creates the tables and prepares the statements.
func (l *Table) Prepare(ctx context.Context) error {
	if err := serverguard.CheckServer(ctx, l.db); err != nil {
		return err
	}
	if err := l.createTables(ctx); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	var err error
	prep := func(query string) *sql.Stmt {
		if err != nil {
			return nil
		}
		var stmt *sql.Stmt
		stmt, err = l.db.PrepareContext(ctx, query)
		return stmt
	}
	st := &statements{grab: prep(grab), dropExpired: prep(dropExpired),
		renew: prep(renew), free: prep(free), sweep: prep(sweep)}
	if err != nil {
		st.close()
		return err
	}
	l.stmts.Store(st)
	return nil
}

// Close closes the prepared statements, not db, which the caller owns.
func (l *Table) Close() error {
	if st := l.stmts.Load(); st != nil {
		st.close()
	}
	return nil
}

// createTables creates the tables and announces the Locker's TTL, logged:
// a replica needs them to be promoted (serverguard).
func (l *Table) createTables(ctx context.Context) error {
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	restore, err := serverguard.LogOn(ctx, conn)
	if err != nil {
		return err
	}
	for _, q := range createTables {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			restore()
			return err
		}
	}
	ttl := l.ttl.Microseconds()
	if _, err := conn.ExecContext(ctx, announceTTL, ttl, ttl); err != nil {
		restore()
		return err
	}
	return restore()
}

// Try is the Table's grab for a plain Line: a new server run's epoch is
// learned here, and its grace waited out by the Line's polls.
func (l *Table) Try(ctx context.Context, key, owner string) (uint64, error) {
	token, err := l.Grab(ctx, key, owner)
	if errors.Is(err, ErrNoEpoch) {
		_, err = l.learn(ctx)
	}
	return token, err
}

// Renew extends only owner's own unexpired lease.
func (l *Table) Renew(ctx context.Context, key, owner string) error {
	return mysqllock.RowsOrNotHeld(l.stmts.Load().renew.ExecContext(ctx, l.ttl.Microseconds(), key, owner))
}

// Free deletes owner's own unexpired lease, through the pool.
func (l *Table) Free(ctx context.Context, key, owner string) error {
	return mysqllock.RowsOrNotHeld(l.stmts.Load().free.ExecContext(ctx, key, owner))
}

// TokenOf makes the token of a grant in epoch from its insert id (seq).
func TokenOf(epoch uint64, res sql.Result) (uint64, error) {
	seq, err := res.LastInsertId()
	if err == nil && uint64(seq) >= 1<<seqBits {
		err = errors.New("2^40 grants in this server run: tokens would overflow into the epoch")
	}
	if err != nil {
		return 0, err
	}
	return epoch<<seqBits | uint64(seq), nil
}

// Grab runs the grab statement; 0: someone holds the key. A row whose
// lease ran out is deleted and the grab tried once more. ErrNoEpoch: the
// server run is not the one the table knows (LearnEpoch).
func (l *Table) Grab(ctx context.Context, key, owner string) (uint64, error) {
	st := l.stmts.Load()
	epoch := l.epoch.Load()
	full := 0 // sweeps done
	for try := 0; ; try++ {
		res, err := st.grab.ExecContext(ctx, key, epoch, owner, l.ttl.Microseconds())
		again, err := l.Swept(ctx, err, full)
		if again {
			full++
			try--
			continue
		}
		var myErr *mysql.MySQLError
		switch {
		case err == nil:
			return TokenOf(epoch, res)
		case !errors.As(err, &myErr):
			return 0, err
		case myErr.Number == erBadNull:
			return 0, ErrNoEpoch
		case myErr.Number != erDupEntry:
			return 0, err
		case try > 0:
			return 0, nil // taken by someone else after we dropped it
		}
		res, err = st.dropExpired.ExecContext(ctx, key)
		if err != nil {
			return 0, err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return 0, err // held
		}
	}
}

// ErrNoEpoch: the grab's epoch is not this server run's (or the grace
// after a restart is not over).
var ErrNoEpoch = errors.New("epoch unknown")

// LearnEpoch reads this server run's epoch from the boot row, making the
// row first if the run has none (package doc), and waits out the grace
// after a restart.
func (l *Table) LearnEpoch(ctx context.Context) error {
	grace, err := l.learn(ctx)
	if err != nil {
		return err
	}
	return clock.Sleep(ctx, grace)
}

// learn is LearnEpoch without the wait: it returns the grace left.
func (l *Table) learn(ctx context.Context) (time.Duration, error) {
	l.epochMu.Lock()
	defer l.epochMu.Unlock()
	epoch, grace, err := l.bootEpoch(ctx)
	if err != nil {
		return 0, fmt.Errorf("epoch: %w", err)
	}
	l.epoch.Store(epoch)
	return grace, nil
}

// bootEpoch returns the boot row's epoch and the grace left, making the
// row and giving it an epoch when the run has none: the durable bump is
// committed (flushed) before the boot row hands its epoch out, and both
// run on one connection, which a restart in between would have killed.
func (l *Table) bootEpoch(ctx context.Context) (uint64, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, l.ttl/3)
	defer cancel()
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	read := func() (epoch uint64, grace time.Duration, err error) {
		var us int64
		err = conn.QueryRowContext(ctx, readBoot).Scan(&epoch, &us)
		return epoch, time.Duration(us) * time.Microsecond, err
	}
	epoch, grace, err := read()
	if err == nil && epoch > 0 {
		return epoch, grace, nil
	}
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, 0, err
	}
	// A new server run (a restart, a promoted replica) may not have the
	// settings prepare checked: check again before it hands out an epoch.
	if err := serverguard.CheckServer(ctx, l.db); err != nil {
		return 0, 0, err
	}
	if _, err := conn.ExecContext(ctx, placeBoot, l.ttl.Microseconds()); err != nil {
		return 0, 0, err
	}
	// The bump is logged: a promoted replica must bump past it.
	restore, err := serverguard.LogOn(ctx, conn)
	if err != nil {
		return 0, 0, err
	}
	bumped, err := bump(ctx, conn)
	if err := errors.Join(err, restore()); err != nil {
		return 0, 0, err
	}
	if _, err := conn.ExecContext(ctx, setBoot, bumped); err != nil {
		return 0, 0, err
	}
	return read() // ours, or another Locker's
}

// bump adds 1 to the durable epoch and returns it, committed.
func bump(ctx context.Context, conn *sql.Conn) (int64, error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	res, err := tx.ExecContext(ctx, bumpEpoch)
	var bumped int64
	if err == nil {
		bumped, err = res.LastInsertId()
	}
	if err != nil {
		tx.Rollback()
		return 0, err
	}
	return bumped, tx.Commit()
}
