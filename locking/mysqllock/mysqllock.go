// Package mysqllock is a lease lock kept in a MySQL table, beside the data it
// protects: the seeds' lock-table design, made safe under faults.
//
// # How it works
//
// One row per key in oversold_locks: lock_key, owner (random per Acquire),
// token, expires_at. Every time comes from the database's clock
// (UTC_TIMESTAMP(6)), never a client's, so replicas with skewed clocks agree
// on who holds a lease; UTC rather than NOW() so that neither a session's
// time_zone nor a daylight-saving change moves an expiry.
//
//   - Acquire is one statement: INSERT ... ON DUPLICATE KEY UPDATE inserts the
//     row, or takes it over when its lease has run out (or it was released),
//     bumping token; InnoDB's row lock makes the check and the grant atomic.
//     LAST_INSERT_ID(expr) hands the new token back in the same round trip,
//     and 0 when someone else holds the key.
//   - A waiter blocks in GET_LOCK on the key's named lock, which the holder
//     took before its grab and gives up in the statement that frees the row,
//     so a release wakes the next waiter at once (queue.go). The named lock
//     is only a wake-up: the row alone grants the key. Where the named lock
//     cannot help (its holder is not the row's, no connection to spare), a
//     waiter polls the holder's remaining lease with a plain SELECT (a
//     consistent read: no row lock, so waiters never delay the holder's
//     renewals), sleeping a jittered backoff that starts at Config.MinPoll and
//     doubles up to Config.MaxPoll, but never past the holder's remaining
//     lease; when the row looks free it tries the INSERT again.
//   - The holder renews every TTL/3 through locking.Keepalive with an UPDATE
//     that matches only its own, unexpired row, so a renewal never revives an
//     expired lease or extends someone else's (REFERENCES.md, lesson 3).
//   - Release frees the row (empty owner, expiry in the past) only while it is
//     still this lease's and unexpired; otherwise it returns ErrNotHeld.
//
// # Token
//
// The row's token column: 1 on the first grant, +1 on every takeover, in the
// same statement as the grant, so never 0. Rows are never deleted (Release frees them),
// so the counter survives releases and tokens strictly increase per key.
// Do not prune the table: a deleted row restarts its key at token 1, and a
// fencing guard then refuses every new holder until the tokens catch up
// (safe, but stuck). The table holds one small row per key ever locked.
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
//     learns at its next renewal, within TTL/3), so fence writes.
//   - The database unreachable: Acquire fails with ErrUnavailable; holders
//     cannot renew, and Lost closes when their validity runs out. A failover
//     to a replica that missed recent grants can hand a key out twice, with
//     a repeated token; since the lock table lives in the same database as
//     the data it guards, the fencing column rolls back with it.
//   - A wait ended by its context returns at once and leaves nothing
//     behind. The grab statement is never abandoned halfway (an abandoned
//     INSERT can still commit on the server after the client gave up): it
//     finishes in the background, and a row it won is freed. Every
//     statement is bounded by TTL/3; only a grab that times out can land
//     later still, and nobody renews it, so it frees within TTL like a dead
//     holder's.
//   - Every grant and every release is a commit, flushed to disk under the
//     default innodb_flush_log_at_trx_commit=1: a hot key changes hands at
//     most about once per flush, where a bare GET_LOCK writes nothing. The
//     token's durability needs the grant's flush; the release's is only
//     overlapped with the next grant (the named lock is released before the
//     commit, see freeQueued).
//   - Only a fallback polls (a holder whose connection to the named lock
//     died, or that came in while no queue connection was spare): then the
//     key idles until the first waiter's next poll, at most MaxPoll.
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

	"github.com/oversold-lab/oversold/locking"
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

// Table is the lock table's name. It is created on first use.
const Table = "oversold_locks"

// MaxKeyLen is the longest key, in bytes, the table stores.
const MaxKeyLen = 255

// Keys are bytes compared exactly (VARBINARY): a case-insensitive or
// pad-space collation would merge keys that differ only in case or in
// trailing spaces. Concurrent CREATE TABLE IF NOT EXISTS is safe: the
// server serialises it on the table name's metadata lock.
const createTable = `CREATE TABLE IF NOT EXISTS oversold_locks (
	lock_key   VARBINARY(255)  NOT NULL PRIMARY KEY,
	owner      CHAR(32) CHARACTER SET ascii NOT NULL,
	token      BIGINT UNSIGNED NOT NULL,
	expires_at DATETIME(6)     NOT NULL
) ENGINE=InnoDB`

// grab inserts the row or takes over an expired one. The assignments see
// columns already assigned to their left, so expires_at, which every IF
// tests, is assigned last. LAST_INSERT_ID(expr) sets the id the server
// returns with the result, and the last call wins: 1 for a new row (VALUES
// is evaluated before the duplicate is found), token+1 for a takeover, 0
// when the row stays someone else's. Parameters are repeated rather than
// read with VALUES(), which MySQL 8 deprecates.
// Args: key, owner, ttl µs, owner, ttl µs.
const grab = `INSERT INTO oversold_locks (lock_key, owner, token, expires_at)
VALUES (?, ?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
	owner      = IF(expires_at < UTC_TIMESTAMP(6), ?, owner),
	token      = IF(expires_at < UTC_TIMESTAMP(6), LAST_INSERT_ID(token + 1), token + LAST_INSERT_ID(0)),
	expires_at = IF(expires_at < UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, expires_at)`

// remaining reads the holder's lease left, in µs (<= 0 or no row: free),
// and whether the holder holds the key's named lock (queue.go).
const remaining = `SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), owner LIKE 'q%'
FROM oversold_locks WHERE lock_key = ?`

// renew extends only our own unexpired lease. Args: ttl µs, key, owner.
const renew = `UPDATE oversold_locks SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE lock_key = ? AND owner = ? AND expires_at >= UTC_TIMESTAMP(6)`

// free gives up our own unexpired lease, keeping the row and its token.
// Args: key, owner.
const free = `UPDATE oversold_locks SET owner = '', expires_at = '1970-01-01'
WHERE lock_key = ? AND owner = ? AND expires_at >= UTC_TIMESTAMP(6)`

// Locker grants leases from the lock table in db. It is safe for
// concurrent use.
type Locker struct {
	db  *sql.DB
	cfg Config

	prepMu sync.Mutex
	stmts  atomic.Pointer[statements] // set by the first Acquire

	mu         sync.Mutex
	leases     map[*lease]struct{} // held, so that Close can end their renewals
	closed     bool
	idleQueue  []*queueConn   // queue connections kept for reuse
	queueOut   int            // queue connections out of the pool
	background sync.WaitGroup // grabs that may outlive their Acquire
}

// statements are prepared once per Locker, so each costs one round trip:
// unprepared, go-sql-driver prepares, runs and closes every statement with
// arguments (unless the DSN sets interpolateParams).
type statements struct {
	grab, remaining, renew, free *sql.Stmt
}

func (s *statements) close() {
	for _, stmt := range []*sql.Stmt{s.grab, s.remaining, s.renew, s.free} {
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
		// It may hold the named lock, or be broken by a cancelled wait.
		l.putQueueConn(qc, false)
		if !errors.Is(err, errStaleQueueConn) || try > 0 {
			return nil, err
		}
		// An idle queue connection the server dropped (a restart, its
		// wait_timeout, a KILL): so are its idle peers, likely. Nothing
		// was done yet: try once more on a fresh one.
		l.closeIdleQueue()
	}
}

// errStaleQueueConn: the first statement on a queue connection failed.
var errStaleQueueConn = errors.New("queue connection failed")

// acquire grabs the row, queued on qc's named lock when qc is not nil. The
// returned lease keeps qc if it holds the named lock; else qc goes back.
func (l *Locker) acquire(ctx context.Context, key string, qc *queueConn) (*lease, error) {
	q := queueName(key)
	queued := false // we hold q: first in line
	var err error
	if qc != nil {
		// q is free unless the key is held or waited for, and then we
		// join the wait below instead of grabbing.
		if queued, err = qc.lock(ctx, q, 0); err != nil {
			return nil, l.failed(ctx, key, fmt.Errorf("%w: %w", errStaleQueueConn, err))
		}
	}
	poll := l.cfg.MinPoll
	for {
		if qc != nil && !queued {
			left, holderQueued, err := l.remaining(ctx, key)
			if err != nil {
				return nil, l.failed(ctx, key, err)
			}
			wait := left
			switch {
			case left > 0 && !holderQueued:
				// Its holder will not wake us: poll.
				if err := sleep(ctx, min(jitter(poll), left)); err != nil {
					return nil, fmt.Errorf("acquire %q: %w", key, err)
				}
				poll = min(2*poll, l.cfg.MaxPoll)
				continue
			case left <= 0:
				// Free, yet q is taken: by the waiter it went to, about to
				// grab, or by a holder between freeing the row and q. Do
				// not barge; but a holder paused past its lease may keep q
				// for long, so grab anyway after MaxPoll.
				wait = l.cfg.MaxPoll
			}
			// Wait no longer than the holder's lease: it may expire.
			if queued, err = qc.lock(ctx, q, min(wait, l.cfg.TTL)); err != nil {
				return nil, l.failed(ctx, key, err)
			}
			if !queued && left > 0 {
				continue // renewed or expired meanwhile: look again
			}
		}
		owner := newOwner(queued)
		sent := time.Now()
		token, err := l.grab(ctx, key, owner)
		if err != nil {
			return nil, l.failed(ctx, key, err)
		}
		if token != 0 {
			if !queued {
				l.putQueueConn(qc, true)
				qc = nil
			}
			return l.hold(key, owner, token, sent, qc), nil
		}
		if qc != nil && !queued {
			continue // someone else took the free row: wait for it
		}
		// First in line behind a holder that will not wake us (its
		// connection died, or it came in unqueued), or no queue at all:
		// poll the holder's lease until it looks free.
		for left := l.cfg.MaxPoll; left > 0; {
			if err := sleep(ctx, min(jitter(poll), left)); err != nil {
				return nil, fmt.Errorf("acquire %q: %w", key, err)
			}
			poll = min(2*poll, l.cfg.MaxPoll)
			if left, _, err = l.remaining(ctx, key); err != nil {
				return nil, l.failed(ctx, key, err)
			}
		}
	}
}

// grab runs the grab statement and returns the token won, or 0.
//
// The statement is never abandoned halfway: cancelled in flight, the driver
// only closes the connection, and the server may still commit the INSERT
// after our cleanup ran, leaving a row that nobody releases for a whole TTL.
// So it runs in a goroutine on a context the caller cannot cancel, while the
// caller waits for it or for ctx. The unbuffered handoff settles who owns
// the outcome: the caller, if it took the result; else the goroutine, which
// frees whatever it won. An unknown outcome (an error) is freed either way.
func (l *Locker) grab(ctx context.Context, key, owner string) (uint64, error) {
	type result struct {
		token uint64
		err   error
	}
	handoff := make(chan result)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, errClosed
	}
	l.background.Add(1) // under mu: Close waits only after no more can start
	l.mu.Unlock()
	go func() {
		defer l.background.Done()
		token, err := l.grabOnce(ctx, key, owner)
		delivered := false
		select {
		case handoff <- result{token, err}:
			delivered = true
		case <-ctx.Done():
		}
		if err != nil || (token != 0 && !delivered) {
			l.free(ctx, key, owner)
		}
	}()
	select {
	case r := <-handoff:
		return r.token, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// grabOnce runs the grab statement, bounded by TTL/3: a grant confirmed
// that late still leaves most of its lease.
func (l *Locker) grabOnce(ctx context.Context, key, owner string) (uint64, error) {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.TTL/3)
	defer cancel()
	ttl := l.cfg.TTL.Microseconds()
	res, err := l.stmts.Load().grab.ExecContext(gctx, key, owner, ttl, owner, ttl)
	var token int64
	if err == nil {
		token, err = res.LastInsertId()
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) && myErr.Number == erDeadlock {
		return 0, nil // InnoDB rolled the statement back whole: not won, poll on
	}
	return uint64(token), err
}

// erDeadlock is ER_LOCK_DEADLOCK. Concurrent grabs of one row queue on its
// lock rather than deadlock, but InnoDB asks every client to be ready to
// retry one, and a wait should not fail for it.
const erDeadlock = 1213

// remaining returns how long the key's holder has left (<= 0 when free)
// and whether it holds the key's named lock.
// A read may be abandoned, so it runs on the caller's ctx, bounded by TTL/3
// like every statement here: a database that slow cannot keep leases.
func (l *Locker) remaining(ctx context.Context, key string) (time.Duration, bool, error) {
	rctx, cancel := context.WithTimeout(ctx, l.cfg.TTL/3)
	defer cancel()
	var (
		us     int64
		queued bool
	)
	err := l.stmts.Load().remaining.QueryRowContext(rctx, key).Scan(&us, &queued)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return time.Duration(us) * time.Microsecond, queued, err
}

// free frees our row on a fresh bounded context: cleanup must run even when
// the caller's ctx is what ended the wait. It is best effort; a row it
// misses expires within TTL.
func (l *Locker) free(ctx context.Context, key, owner string) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.TTL/3)
	defer cancel()
	l.stmts.Load().free.ExecContext(fctx, key, owner)
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
	if _, err := l.db.ExecContext(ctx, createTable); err != nil {
		return fmt.Errorf("create table %s: %w", Table, err)
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
	st := &statements{grab: prep(grab), remaining: prep(remaining), renew: prep(renew), free: prep(free)}
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

// hold starts renewing a lease granted by a statement sent at sent; qc,
// if not nil, holds the key's named lock until Release.
func (l *Locker) hold(key, owner string, token uint64, sent time.Time, qc *queueConn) *lease {
	s := &lease{locker: l, key: key, owner: owner, token: token, queue: qc}
	var onFail func(error)
	if f := l.cfg.OnRenewalFailed; f != nil {
		onFail = func(err error) { f(key, err) }
	}
	s.keepalive = locking.StartKeepalive(l.cfg.TTL, sent, s.renew, onFail)
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.leases[s] = struct{}{}
	}
	l.mu.Unlock()
	if closed { // Close ran during the grab: it ends this lease too
		s.keepalive.Stop()
		s.keepalive.MarkLost()
		s.queue = nil
		l.putQueueConn(qc, false)
	}
	return s
}

var errClosed = errors.New("locker closed")

// Close stops renewing the leases still held and closes their Lost
// channels; their rows expire within TTL. It waits for the cleanup of
// abandoned waits, then closes the prepared statements, not db, which the
// caller owns.
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
	keepalive *locking.Keepalive

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
	q := queueName(s.key)
	res, err := qc.free.ExecContext(ctx, s.key, s.owner, q)
	err = rowsOrNotHeld(res, err)
	clean := err == nil // the statement released q
	if err != nil {
		// Whether it reached RELEASE_LOCK is unknown: make sure.
		_, uerr := qc.unlock(ctx, q)
		clean = uerr == nil
	}
	s.locker.putQueueConn(qc, clean)
	return err
}

// rowsOrNotHeld maps an UPDATE that matched no row to ErrNotHeld. Our
// updates always change a row they match (a new expiry, or an emptied owner), so
// the count is the same with or without the clientFoundRows DSN option.
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

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
