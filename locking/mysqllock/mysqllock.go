// Package mysqllock is a lease lock kept in MySQL, beside the data it
// protects: the seeds' lock-table design, made safe under faults, and
// written so that a grant costs no flush to disk.
//
// # How it works
//
// One row per held key in oversold_leases, a MEMORY table: lock_key, owner
// (random per Acquire), seq, epoch, expires_at. A MEMORY table is never
// written to disk, so taking and giving up a lease commits nothing to the
// redo log (a plain GET_LOCK writes nothing either); its contents vanish
// when the server restarts, which the epoch covers (below). Every time
// comes from the database's clock (UTC_TIMESTAMP(6)), never a client's, so
// replicas with skewed clocks agree on who holds a lease; UTC rather than
// NOW() so that neither a session's time_zone nor a daylight-saving change
// moves an expiry.
//
//   - Acquire grabs with an INSERT of the key's row, which the primary
//     key refuses while someone holds the key. Its AUTO_INCREMENT seq
//     comes back with the result and makes the token (below). A row whose
//     lease ran out (a dead or paused holder) is deleted, then the INSERT
//     tried again. The table lock of the MEMORY engine makes each
//     statement atomic. On a free key the first grab also takes the key's
//     named lock (queue.go): one statement, as one GET_LOCK.
//   - A waiter blocks in GET_LOCK on the key's named lock, which the holder
//     took with its grab and gives up in the statement that deletes the
//     row, so a release wakes the next waiter at once (queue.go). The named
//     lock is only a wake-up: the row alone grants the key. Where the named
//     lock cannot help (its holder is not the row's, no connection to
//     spare), a waiter polls the holder's remaining lease with a plain
//     SELECT, sleeping a jittered backoff that starts at Config.MinPoll and
//     doubles up to Config.MaxPoll, but never past the holder's remaining
//     lease; when the row looks free it tries the INSERT again.
//   - The holder renews every TTL/3 through keepalive.Watchdog with an UPDATE
//     that matches only its own, unexpired row, so a renewal never revives an
//     expired lease or extends someone else's (REFERENCES.md, lesson 3).
//   - Release deletes the row only while it is still this lease's and
//     unexpired; otherwise it returns ErrNotHeld.
//
// # Token
//
// Token = epoch << 40 | seq. seq is the MEMORY table's AUTO_INCREMENT: it
// grows with every grant of any key and is never reused while the server
// runs (a DELETE does not lower it), so within one server run a later
// grant of a key has a larger token. epoch counts server runs: it lives in
// oversold_lock_epochs (InnoDB, durable). After a restart the table is
// empty and seq starts again at 1, and the first grab finds no epoch for
// this run in oversold_lock_boot (MEMORY too): it fails, and the Locker
// adds 1 to the durable epoch, waits for that commit to be flushed, and
// only then records the new epoch in the boot row, on the same
// connection (a restart in between kills the connection, so no boot row
// can name an epoch bumped before the restart). Every grab names the
// epoch it builds its token from and the INSERT takes place only if the
// boot row has that epoch: tokens of a later run are larger than any of
// an earlier run, across a crash too, as long as commits are flushed
// (innodb_flush_log_at_trx_commit=1, the default, and sync_binlog=1 with
// the binary log on: a server without them is refused, server.go). 2^40
// grants fit in one server run; past that Acquire fails until a restart.
//
// Do not TRUNCATE oversold_leases, or ALTER its AUTO_INCREMENT, by hand:
// seq would start again within a run and tokens repeat. Deleting rows is
// harmless (a deleted lease is lost, as after an expiry).
//
// # Failure modes
//
//   - A holder that dies keeps its row until the lease expires: the key frees
//     TTL after the last renewal, and a waiter takes it on its next poll.
//   - A holder paused past its lease (GC, SIGSTOP, slow network) loses the
//     key to another holder while it still believes it holds it. Its Lost
//     channel closes when its own clock says the lease ran out (the send
//     time of the last successful renewal plus TTL minus a drift margin),
//     which is before the database expires the row; code that keeps writing
//     after that is stopped only by the fencing token.
//   - A step of the database's wall clock (NTP) moves every expiry: forward,
//     a lease can be taken over before its holder's Lost closes (the holder
//     learns at its next renewal, within TTL/3), so fence writes. Tokens do
//     not depend on the clock.
//   - The database restarts: every lease is gone with the MEMORY table. No
//     key is granted for one TTL after the boot row is made, so that every
//     holder from before the restart has seen its Lost close by its own
//     clock first (its renewals failed meanwhile, or match no row); then
//     tokens continue in the new epoch. That TTL is the longest any Locker
//     on the database ever announced (each writes its own to
//     oversold_lock_max_ttl, durably, before its first grab), so Lockers
//     of different TTLs (a rolling change of it) are all waited out. It is
//     never lowered on its own: after a TTL was shortened everywhere,
//     UPDATE oversold_lock_max_ttl SET ttl_us = 0, then restart the
//     Lockers (each announces at its first Acquire). The first run of all
//     (the durable epoch still 0) has nothing to wait out.
//   - The database unreachable: Acquire fails with ErrUnavailable; holders
//     cannot renew, and Lost closes when their validity runs out.
//   - A failover to a replica is a restart: the lease and boot tables stay
//     out of the binary log (server.go), so the promoted server has no boot
//     row; its first grab bumps the epoch it replicated and waits one TTL.
//     Its tokens lie above every token whose fenced writes it has: such a
//     write commits after the bump of its token's epoch, which the replica
//     applied first. (A replica that missed the very first bump, epoch 1,
//     has nothing to wait out by that rule and grants at once.) A server
//     demoted without a restart keeps its boot row and leases: restart it,
//     or DELETE FROM oversold_lock_boot, before promoting it again, or its
//     old epoch's tokens, below the ones granted meanwhile, fail the fence.
//   - A wait ended by its context returns at once and leaves nothing
//     behind, unless a grab is in flight. The grab statement is never
//     abandoned halfway (an abandoned INSERT can still land on the server
//     after the client gave up): a cancelled Acquire first lets it finish,
//     and deletes a row it won or may have won (one or two round trips; at
//     most 2·TTL/3 on a server that stopped answering).
//     Every statement is bounded by TTL/3; only a grab that times out can
//     land later still, and nobody renews it, so it frees within TTL like a
//     dead holder's.
//   - Only a fallback polls (a holder whose connection to the named lock
//     died, or that came in while no queue connection was spare): then the
//     key idles until the first waiter's next poll, at most MaxPoll. Such
//     a holder's Release still frees its row, through the pool.
//   - The MEMORY table holds the rows of held keys and of holders that died
//     holding one (until the key is taken again or the server restarts);
//     max_heap_table_size at its creation bounds it (16 MiB, about 45,000
//     rows, by default). A grab that finds it full deletes up to 1,000
//     expired rows and tries again; full of live leases, Acquire fails with
//     ErrUnavailable saying so.
//   - Supported: one primary, with or without asynchronous replicas. The
//     lock's statements stay out of the binary log (server.go; OpenDB),
//     so binlog_format does not matter to them. Galera and Group
//     Replication are refused (no exclusion on MEMORY tables there).
package mysqllock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/keepalive"
)

var _ locking.Locker = (*Locker)(nil)

// Config tunes a Locker. Zero values mean the documented defaults.
type Config struct {
	TTL time.Duration // lease time to live; 0 = 10s
	// Waiters poll with a jittered backoff from MinPoll doubling to MaxPoll.
	MinPoll time.Duration // 0 = 1ms
	MaxPoll time.Duration // 0 = 32ms
	// OnRenewalFailed, if set, hears every failed lease renewal (metrics).
	OnRenewalFailed func(key string, err error)
}

// Table is the lease table's name. It and the epoch tables are created on
// first use.
const Table = "oversold_leases"

// MaxKeyLen is the longest key, in bytes, the table stores.
const MaxKeyLen = 255

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

// remaining reads the holder's lease left, in µs (<= 0 or NULL, no row:
// free), whether the holder holds the key's named lock (queue.go), and the
// connection that holds the named lock (NULL: nobody). Aggregates, so that
// a key without a row still gives one result row. Args: name, key.
const remaining = `SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MAX(expires_at)),
	COALESCE(MAX(owner LIKE 'q%'), 0), IS_USED_LOCK(?)
FROM oversold_leases WHERE lock_key = ?`

// sweep deletes a batch of rows whose lease ran out (dead holders',
// released ones the database never saw), when the table is full: each is
// what dropExpired would delete on the key's next grab.
const sweep = `DELETE FROM oversold_leases WHERE expires_at < UTC_TIMESTAMP(6) LIMIT 1000`

// renew extends only our own unexpired lease. Args: ttl µs, key, owner.
const renew = `UPDATE oversold_leases SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE lock_key = ? AND owner = ? AND expires_at >= UTC_TIMESTAMP(6)`

// free gives up our own unexpired lease. Args: key, owner.
const free = `DELETE FROM oversold_leases WHERE lock_key = ? AND owner = ? AND expires_at >= UTC_TIMESTAMP(6)`

// The epoch of this server run (see Token in the package doc).
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

// swept handles a grab's error: when the lease table is full, it deletes
// a batch of expired rows and says whether to try the grab again (once,
// the first time); else it leaves err alone.
func (l *Locker) swept(ctx context.Context, err error, try int) (bool, error) {
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

// Locker grants leases from the lock table in db. It is safe for
// concurrent use.
type Locker struct {
	db  *sql.DB
	cfg Config

	prepMu sync.Mutex
	stmts  atomic.Pointer[statements] // set by the first Acquire

	epochMu sync.Mutex    // one learnEpoch at a time
	epoch   atomic.Uint64 // this server run's, as last learned; 0: not yet

	mu         sync.Mutex
	leases     map[*lease]struct{} // held, so that Close can end their renewals
	closed     bool
	idleQueue  []*queueConn   // queue connections kept for reuse
	queueOut   int            // queue connections out of the pool
	background sync.WaitGroup // grabs and their holds under way, for Close

	beforeGrab func(first bool) // a test's hook (export_test.go); nil otherwise
}

// statements are prepared once per Locker, so each costs one round trip:
// unprepared, go-sql-driver prepares, runs and closes every statement with
// arguments (unless the DSN sets interpolateParams).
type statements struct {
	grab, dropExpired, remaining, renew, free, sweep *sql.Stmt
}

func (s *statements) close() {
	for _, stmt := range []*sql.Stmt{s.grab, s.dropExpired, s.remaining, s.renew, s.free, s.sweep} {
		if stmt != nil {
			stmt.Close()
		}
	}
}

// New returns a Locker on db, which must be a go-sql-driver/mysql pool. It
// does no I/O: the first Acquire creates the table and prepares statements.
func New(db *sql.DB, cfg Config) *Locker {
	if cfg.TTL <= 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.MinPoll <= 0 {
		cfg.MinPoll = time.Millisecond
	}
	if cfg.MaxPoll <= 0 {
		cfg.MaxPoll = 32 * time.Millisecond
	}
	cfg.MaxPoll = max(cfg.MaxPoll, cfg.MinPoll)
	return &Locker{db: db, cfg: cfg, leases: make(map[*lease]struct{})}
}

// Acquire takes the lock on key, waiting in the key's queue (queue.go)
// while someone else holds it, or polling when there is none to wait in.
func (l *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if len(key) > MaxKeyLen {
		return nil, fmt.Errorf("acquire %q: key longer than %d bytes", key, MaxKeyLen)
	}
	if err := l.prepare(ctx); err != nil {
		return nil, l.failed(ctx, key, err)
	}
	for try := 0; ; try++ {
		qc, err := l.takeQueueConn(ctx)
		if err != nil {
			return nil, l.failed(ctx, key, err)
		}
		s, err := l.acquire(ctx, key, qc)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errStaleQueueConn) || try > 0 {
			return nil, err
		}
		// An idle queue connection the server dropped (a restart, its
		// wait_timeout, a KILL): so are its idle peers, likely. Nothing
		// was done yet: try once more on a fresh one.
		l.closeIdleQueue()
	}
}

// staleName is how long one connection must hold the key's named lock,
// the row free all along, before a waiter grabs without the named lock:
// long next to a waiter's grab or poll (MaxPoll), whose slowness under
// load would otherwise pass for a paused holder and let waiters barge,
// and short next to the TTL the paused holder's lease already took.
func (l *Locker) staleName() time.Duration {
	return max(2*l.cfg.MaxPoll, l.cfg.TTL/10)
}

// errStaleQueueConn: the first statement on a queue connection failed.
var errStaleQueueConn = errors.New("queue connection failed")

// connLost tells whether err says the connection is gone (no answer, or
// the server's word that it killed it), rather than the statement failed.
func connLost(err error) bool {
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		switch myErr.Number {
		case 1053, 1927, 4031: // shutdown; MariaDB's and MySQL's killed connection
			return true
		}
		return false
	}
	return !errors.Is(err, errClosed)
}

// grabbed is a grab's outcome: the token won (0: none), and whether the
// grab took the key's named lock (the first grab on a queue connection).
type grabbed struct {
	token  uint64
	queued bool
}

// acquire grabs the row, queued on qc's named lock when qc is not nil. The
// returned lease keeps qc if it holds the named lock; else qc goes back.
// Each round waits its turn in line (with qc), grabs, and, refused with no
// queue to wake it, polls the holder's lease until it looks free.
func (l *Locker) acquire(ctx context.Context, key string, qc *queueConn) (_ *lease, err error) {
	a := &acquiring{l: l, key: key, qc: qc, q: queueName(key), poll: l.cfg.MinPoll}
	defer func() {
		if err != nil {
			// It may hold the named lock, or be broken by a cancelled wait.
			l.putQueueConn(a.qc, false)
		}
	}()
	if a.qc != nil {
		if s, done, err := a.grabFirst(ctx); done {
			return s, err
		}
	}
	for boots := 0; ; {
		if a.qc != nil && !a.queued {
			again, err := a.waitInLine(ctx)
			if err != nil {
				return nil, err
			}
			if again {
				continue
			}
		}
		owner := newOwner(a.queued)
		sent := time.Now()
		g, err := l.grab(ctx, key, owner, nil)
		if errors.Is(err, errNoEpoch) && boots < maxBoots {
			// The server restarted, or another Locker learned of it first.
			boots++
			if err := l.learnEpoch(ctx); err != nil {
				return nil, l.failed(ctx, key, err)
			}
			continue
		}
		if err != nil {
			return nil, l.failed(ctx, key, err)
		}
		if g.token != 0 {
			return a.hold(ctx, owner, g.token, sent)
		}
		if a.qc != nil && !a.queued {
			continue // someone else took the free row: wait for it
		}
		if err := a.pollUntilFree(ctx); err != nil {
			return nil, err
		}
	}
}

// acquiring is one acquire's state across its rounds.
type acquiring struct {
	l      *Locker
	key    string
	q      string     // the key's named lock: its line
	qc     *queueConn // nil once hold has it, or when there is no queue
	queued bool       // we hold q: first in line
	poll   time.Duration
	// stale is who held q, the row free, when we first saw it so, and
	// since when.
	stale struct {
		name  int64
		since time.Time
	}
}

// grabFirst is the first grab, on qc. done says acquire returns s and err;
// otherwise a.queued says whether the grab took q.
func (a *acquiring) grabFirst(ctx context.Context) (s *lease, done bool, err error) {
	// q is free unless the key is held or waited for: then the first
	// grab takes neither, and we join the wait below. Both free (an
	// uncontended key), one statement takes both.
	owner := newOwner(true)
	sent := time.Now()
	g, err := a.l.grab(ctx, a.key, owner, a.qc)
	if err != nil && connLost(err) {
		err = fmt.Errorf("%w: %w", errStaleQueueConn, err)
	}
	if err != nil {
		return nil, true, a.l.failed(ctx, a.key, err)
	}
	if g.token != 0 {
		s, err := a.l.hold(a.key, owner, g.token, sent, a.qc)
		a.qc = nil // hold's now
		return s, true, a.l.failedIf(ctx, a.key, err)
	}
	a.queued = g.queued
	return nil, false, nil
}

// hold makes the lease of a won grab; it keeps qc only if qc holds q.
func (a *acquiring) hold(ctx context.Context, owner string, token uint64, sent time.Time) (*lease, error) {
	if !a.queued {
		a.l.putQueueConn(a.qc, true)
		a.qc = nil
	}
	s, err := a.l.hold(a.key, owner, token, sent, a.qc)
	a.qc = nil // hold's now
	return s, a.l.failedIf(ctx, a.key, err)
}

// waitInLine waits, not yet first in line, until the row may be grabbed:
// on q when the holder will wake us, else polling. again says to look
// again before grabbing.
func (a *acquiring) waitInLine(ctx context.Context) (again bool, err error) {
	l := a.l
	ws, err := l.remaining(ctx, a.key)
	if err != nil {
		return false, l.failed(ctx, a.key, err)
	}
	if ws.left > 0 || ws.nameHolder != a.stale.name {
		a.stale.name, a.stale.since = 0, time.Time{}
		if ws.left <= 0 {
			a.stale.name, a.stale.since = ws.nameHolder, time.Now()
		}
	}
	wait := ws.left
	switch {
	case ws.left > 0 && !ws.holderQueued:
		// Its holder will not wake us: poll.
		if err := clock.Sleep(ctx, min(jitter(a.poll), ws.left)); err != nil {
			return false, fmt.Errorf("acquire %q: %w", a.key, err)
		}
		a.poll = min(2*a.poll, l.cfg.MaxPoll)
		return true, nil
	case ws.left <= 0 && ws.nameHolder != 0 && time.Since(a.stale.since) >= l.staleName():
		// Free, and q held by the same connection all along:
		// not a waiter about to grab but a holder paused past
		// its lease, still connected. Grab without q.
		wait = 0
	case ws.left <= 0:
		// Free, yet q is taken: by the waiter it went to, about
		// to grab (or by a waiter polling behind a holder that
		// came in without q). Do not barge: wait in line, and
		// look again after MaxPoll.
		wait = l.cfg.MaxPoll
	}
	if wait > 0 {
		// Wait no longer than the holder's lease: it may expire.
		if a.queued, err = a.qc.lock(ctx, a.q, min(wait, l.cfg.TTL)); err != nil {
			return false, l.failed(ctx, a.key, err)
		}
		if !a.queued {
			return true, nil // renewed, expired or still free: look again
		}
	}
	return false, nil
}

// pollUntilFree polls the holder's lease until it looks free: first in
// line behind a holder that will not wake us (its connection died, or it
// came in unqueued), or no queue at all.
func (a *acquiring) pollUntilFree(ctx context.Context) error {
	for left := a.l.cfg.MaxPoll; left > 0; {
		if err := clock.Sleep(ctx, min(jitter(a.poll), left)); err != nil {
			return fmt.Errorf("acquire %q: %w", a.key, err)
		}
		a.poll = min(2*a.poll, a.l.cfg.MaxPoll)
		ws, err := a.l.remaining(ctx, a.key)
		if err != nil {
			return a.l.failed(ctx, a.key, err)
		}
		left = ws.left
	}
	return nil
}

// grab runs the grab statement (grabOnce) and returns what it won; with
// qc, the first grab of an Acquire on qc, which takes the key's named lock
// too (grabQueued).
//
// The statement is never abandoned halfway: cancelled in flight, the driver
// only closes the connection, and the server may still commit the INSERT
// after our cleanup ran, leaving a row that nobody releases for a whole TTL.
// So it runs on a context the caller cannot cancel (bounded by TTL/3), on
// the caller's goroutine: a goroutine of its own, with the caller waiting
// for it or ctx, would return at once but cost a hand-over per grab (666
// against 431 grants a second at 8 contenders, load 25). A grant won as ctx
// ended, and an unknown outcome (an error), are freed. A grant goes on to
// hold, which registers it, or frees it if Close began, before Close closes
// the statements (it waits for both in l.background).
func (l *Locker) grab(ctx context.Context, key, owner string, qc *queueConn) (grabbed, error) {
	if l.beforeGrab != nil {
		l.beforeGrab(qc != nil)
	}
	if err := ctx.Err(); err != nil {
		return grabbed{}, err // a row won now would only be freed again, a turn lost to the next waiter
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return grabbed{}, errClosed
	}
	l.background.Add(1) // under mu: Close waits only after no more can start
	l.mu.Unlock()
	var (
		g   grabbed
		err error
	)
	if qc != nil {
		g, err = l.grabQueued(ctx, key, owner, qc)
	} else {
		g.token, err = l.grabOnce(ctx, key, owner)
	}
	if g.token != 0 && ctx.Err() == nil {
		return g, nil // hold calls l.background.Done
	}
	if g.token != 0 {
		g, err = grabbed{}, ctx.Err()
	}
	if err != nil && !errors.Is(err, errNoEpoch) {
		l.free(ctx, key, owner)
	}
	l.background.Done()
	return g, err
}

// grabQueued runs the first grab of an Acquire on qc: the row and the
// key's named lock in one statement when both are free. 0 rows: neither
// is ours (the named lock is taken, or our epoch is not the run's: the
// plain grab learns that). A duplicate: the named lock is ours, the row
// someone's. Bounded by TTL/3 like grabOnce.
func (l *Locker) grabQueued(ctx context.Context, key, owner string, qc *queueConn) (grabbed, error) {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.TTL/3)
	defer cancel()
	epoch := l.epoch.Load()
	res, err := qc.grab.ExecContext(gctx, key, owner, l.cfg.TTL.Microseconds(), epoch, queueName(key))
	if again, serr := l.swept(gctx, err, 0); again {
		res, err = qc.grab.ExecContext(gctx, key, owner, l.cfg.TTL.Microseconds(), epoch, queueName(key))
		_, err = l.swept(gctx, err, 1)
	} else {
		err = serr
	}
	var myErr *mysql.MySQLError
	switch {
	case errors.As(err, &myErr) && myErr.Number == erDupEntry:
		return grabbed{queued: true}, nil
	case err != nil:
		return grabbed{}, err
	}
	n, err := res.RowsAffected()
	if err != nil || n == 0 {
		return grabbed{}, err
	}
	token, err := tokenOf(epoch, res)
	return grabbed{token: token, queued: true}, err
}

// tokenOf makes the token of a grant in epoch from its insert id (seq).
func tokenOf(epoch uint64, res sql.Result) (uint64, error) {
	seq, err := res.LastInsertId()
	if err == nil && uint64(seq) >= 1<<seqBits {
		err = errors.New("2^40 grants in this server run: tokens would overflow into the epoch")
	}
	if err != nil {
		return 0, err
	}
	return epoch<<seqBits | uint64(seq), nil
}

// grabOnce runs the grab statement, bounded by TTL/3: a grant confirmed
// that late still leaves most of its lease. A row whose lease ran out is
// deleted and the grab tried once more.
func (l *Locker) grabOnce(ctx context.Context, key, owner string) (uint64, error) {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.TTL/3)
	defer cancel()
	st := l.stmts.Load()
	epoch := l.epoch.Load()
	full := 0 // sweeps done
	for try := 0; ; try++ {
		res, err := st.grab.ExecContext(gctx, key, epoch, owner, l.cfg.TTL.Microseconds())
		again, err := l.swept(gctx, err, full)
		if again {
			full++
			try--
			continue
		}
		var myErr *mysql.MySQLError
		switch {
		case err == nil:
			return tokenOf(epoch, res)
		case !errors.As(err, &myErr):
			return 0, err
		case myErr.Number == erBadNull:
			return 0, errNoEpoch
		case myErr.Number != erDupEntry:
			return 0, err
		case try > 0:
			return 0, nil // taken by someone else after we dropped it
		}
		res, err = st.dropExpired.ExecContext(gctx, key)
		if err != nil {
			return 0, err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return 0, err // held
		}
	}
}

// errNoEpoch: the grab's epoch is not this server run's (or the grace
// after a restart is not over).
var errNoEpoch = errors.New("epoch unknown")

// maxBoots bounds the epochs one Acquire learns: a server restarting over
// and over fails it instead of looping.
const maxBoots = 3

// learnEpoch reads this server run's epoch from the boot row, making the
// row first if the run has none (package doc, Token), and waits out the
// grace after a restart.
func (l *Locker) learnEpoch(ctx context.Context) error {
	l.epochMu.Lock()
	epoch, grace, err := l.bootEpoch(ctx)
	if err == nil {
		l.epoch.Store(epoch)
	}
	l.epochMu.Unlock()
	if err != nil {
		return fmt.Errorf("epoch: %w", err)
	}
	if grace > 0 {
		return clock.Sleep(ctx, grace)
	}
	return nil
}

// bootEpoch returns the boot row's epoch and the grace left, making the
// row and giving it an epoch when the run has none: the durable bump is
// committed (flushed) before the boot row hands its epoch out, and both
// run on one connection, which a restart in between would have killed.
func (l *Locker) bootEpoch(ctx context.Context) (uint64, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.TTL/3)
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
	if err := checkServer(ctx, l.db); err != nil {
		return 0, 0, err
	}
	if _, err := conn.ExecContext(ctx, placeBoot, l.cfg.TTL.Microseconds()); err != nil {
		return 0, 0, err
	}
	// The bump is logged: a promoted replica must bump past it.
	restore, err := logOn(ctx, conn)
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

// waitState is what remaining reads: the holder's lease left (<= 0 when
// free), whether the holder holds the key's named lock, and which
// connection holds the named lock (0: nobody).
type waitState struct {
	left         time.Duration
	holderQueued bool
	nameHolder   int64
}

// remaining reads the key's waitState.
// A read may be abandoned, so it runs on the caller's ctx, bounded by TTL/3
// like every statement here: a database that slow cannot keep leases.
func (l *Locker) remaining(ctx context.Context, key string) (waitState, error) {
	rctx, cancel := context.WithTimeout(ctx, l.cfg.TTL/3)
	defer cancel()
	var (
		us, holder sql.NullInt64
		ws         waitState
	)
	err := l.stmts.Load().remaining.QueryRowContext(rctx, queueName(key), key).Scan(&us, &ws.holderQueued, &holder)
	ws.left = time.Duration(us.Int64) * time.Microsecond
	ws.nameHolder = holder.Int64
	return ws, err
}

// free frees our row through the pool on a fresh bounded context: cleanup
// must run even when the caller's ctx is what ended the wait, or when a
// statement before it used ctx up. A row it misses expires within TTL.
func (l *Locker) free(ctx context.Context, key, owner string) error {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.TTL/3)
	defer cancel()
	res, err := l.stmts.Load().free.ExecContext(fctx, key, owner)
	return rowsOrNotHeld(res, err)
}

// failedIf is failed for a non-nil err.
func (l *Locker) failedIf(ctx context.Context, key string, err error) error {
	if err == nil {
		return nil
	}
	return l.failed(ctx, key, err)
}

// failed wraps an error that ended Acquire: the caller's ctx when that is
// what ended it, else the database's failure as ErrUnavailable.
func (l *Locker) failed(ctx context.Context, key string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("acquire %q: %w", key, ctx.Err())
	}
	// A socket deadline taken from ctx can fire just before ctx's own timer.
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return fmt.Errorf("acquire %q: %w", key, context.DeadlineExceeded)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// Our own statement timeout, not the caller's deadline: do not wrap
		// it, or errors.Is(err, context.DeadlineExceeded) would lie.
		err = errors.New("the database did not answer in time")
	}
	return fmt.Errorf("acquire %q: %w: %w", key, locking.ErrUnavailable, err)
}

// prepareTimeout bounds the one-time setup, which may create the table.
const prepareTimeout = 10 * time.Second

// prepare creates the table and prepares the statements, once; a failure
// is retried by the next Acquire.
func (l *Locker) prepare(ctx context.Context) error {
	if l.stmts.Load() != nil {
		return nil
	}
	l.prepMu.Lock()
	defer l.prepMu.Unlock()
	if l.stmts.Load() != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, prepareTimeout)
	defer cancel()
	if err := checkServer(ctx, l.db); err != nil {
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
	st := &statements{grab: prep(grab), dropExpired: prep(dropExpired), remaining: prep(remaining),
		renew: prep(renew), free: prep(free), sweep: prep(sweep)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil && l.closed {
		err = errClosed
	}
	if err != nil {
		st.close()
		return fmt.Errorf("prepare: %w", err)
	}
	l.stmts.Store(st)
	return nil
}

// createTables creates the tables and announces the Locker's TTL, logged:
// a replica needs them to be promoted (server.go).
func (l *Locker) createTables(ctx context.Context) error {
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	restore, err := logOn(ctx, conn)
	if err != nil {
		return err
	}
	for _, q := range createTables {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			restore()
			return err
		}
	}
	ttl := l.cfg.TTL.Microseconds()
	if _, err := conn.ExecContext(ctx, announceTTL, ttl, ttl); err != nil {
		restore()
		return err
	}
	return restore()
}

// hold starts renewing a lease granted by a statement sent at sent; qc,
// if not nil, holds the key's named lock until Release. grab counted it
// in l.background, so the statements are open until it returns. A grant
// that lands while Close runs is freed at once: errClosed.
func (l *Locker) hold(key, owner string, token uint64, sent time.Time, qc *queueConn) (*lease, error) {
	defer l.background.Done()
	s := &lease{locker: l, key: key, owner: owner, token: token, queue: qc}
	var onFail func(error)
	if f := l.cfg.OnRenewalFailed; f != nil {
		onFail = func(err error) { f(key, err) }
	}
	s.keepalive = keepalive.Start(l.cfg.TTL, sent, s.renew, onFail)
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.leases[s] = struct{}{}
	}
	l.mu.Unlock()
	if closed { // Close ran during the grab: undo the grant
		s.keepalive.Stop()
		s.keepalive.MarkLost()
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL/3)
		defer cancel()
		s.free(ctx) // best effort: a row it misses expires within TTL
		return nil, errClosed
	}
	return s, nil
}

var errClosed = errors.New("locker closed")

// Close stops renewing the leases still held and closes their Lost
// channels; their rows expire within TTL. It waits for the grabs under
// way and their holds (a grant landing now is freed), then closes the
// prepared statements, not db, which the caller owns.
func (l *Locker) Close() error {
	l.mu.Lock()
	l.closed = true
	held := l.leases
	l.leases = make(map[*lease]struct{})
	l.mu.Unlock()
	for s := range held {
		s.keepalive.Stop()
		s.keepalive.MarkLost()
		s.mu.Lock()
		l.putQueueConn(s.queue, false)
		s.queue = nil
		s.mu.Unlock()
	}
	l.closeIdleQueue()
	l.background.Wait()
	if st := l.stmts.Load(); st != nil {
		st.close()
	}
	return nil
}

type lease struct {
	locker    *Locker
	key       string
	owner     string
	token     uint64
	keepalive *keepalive.Watchdog

	mu       sync.Mutex
	released bool
	queue    *queueConn // holds the key's named lock; nil once given up
}

func (s *lease) Key() string           { return s.key }
func (s *lease) Token() uint64         { return s.token }
func (s *lease) Lost() <-chan struct{} { return s.keepalive.Lost() }

func (s *lease) renew(ctx context.Context) error {
	res, err := s.locker.stmts.Load().renew.ExecContext(ctx, s.locker.cfg.TTL.Microseconds(), s.key, s.owner)
	return rowsOrNotHeld(res, err)
}

// Release stops renewal, then frees the row if it is still ours, and gives
// up the key's named lock. After a failure to reach the database it may be
// called again.
func (s *lease) Release(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released {
		return fmt.Errorf("release %q: %w", s.key, locking.ErrNotHeld)
	}
	s.keepalive.Stop()
	l := s.locker
	l.mu.Lock()
	delete(l.leases, s)
	l.mu.Unlock()
	// A fresh context bounded by the TTL (past it the row has expired
	// anyway): a caller's cancelled ctx must not leave the row held.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.TTL)
	defer cancel()
	err := s.free(ctx)
	switch {
	case errors.Is(err, locking.ErrNotHeld):
		s.released = true
		s.keepalive.MarkLost() // expired or taken over while we thought we held it
		return fmt.Errorf("release %q: %w", s.key, err)
	case err != nil:
		return fmt.Errorf("release %q: %w: %w", s.key, locking.ErrUnavailable, err)
	}
	s.released = true
	return nil
}

// free frees the row, and gives up the named lock if it holds it: in the
// same statement when it frees the row (queue.go), else on its own.
func (s *lease) free(ctx context.Context) error {
	qc := s.queue
	if qc == nil {
		res, err := s.locker.stmts.Load().free.ExecContext(ctx, s.key, s.owner)
		return rowsOrNotHeld(res, err)
	}
	s.queue = nil
	res, err := qc.free.ExecContext(ctx, s.key, s.owner)
	err = rowsOrNotHeld(res, err)
	clean := err == nil // the statement released the named lock
	switch {
	case err != nil && !errors.Is(err, locking.ErrNotHeld) && connLost(err):
		// The connection died while we held the key (a KILL, a proxy's
		// reset), and its named lock with it; our row is likely still
		// there, and would block the key for the rest of its lease:
		// free it through the pool.
		err = s.locker.free(ctx, s.key, s.owner)
	case err != nil:
		// Whether it reached RELEASE_ALL_LOCKS is unknown: make sure.
		clean = qc.unlock(ctx) == nil
	}
	s.locker.putQueueConn(qc, clean)
	return err
}

// rowsOrNotHeld maps an UPDATE or DELETE that matched no row to
// ErrNotHeld. A renewal always changes the row it matches (a new expiry),
// so the count is the same with or without the clientFoundRows DSN option.
func rowsOrNotHeld(res sql.Result, err error) error {
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

// newOwner returns this grab's identity on the row: a prefix saying whether
// it holds the key's named lock, then 31 random hex digits.
func newOwner(queued bool) string {
	var b [32]byte
	b[0] = unqueuedOwner
	if queued {
		b[0] = queuedOwner
	}
	var r [16]byte
	rand.Read(r[:]) // never fails (crypto/rand, Go 1.24+)
	hex.Encode(b[1:], r[:15])
	b[31] = "0123456789abcdef"[r[15]&15]
	return string(b[:])
}

// jitter returns a duration in [d/2, d): waiters that started together
// spread out instead of polling in lockstep.
func jitter(d time.Duration) time.Duration {
	if d < 2 {
		return d
	}
	return d/2 + mrand.N(d/2)
}
