package namedqueue

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/memtable"
)

var _ mysqllock.Line = (*Queue)(nil)

// Queue is the Line of a Locker on table. It is safe for concurrent use.
type Queue struct {
	table            *memtable.Table
	minPoll, maxPoll time.Duration

	mu        sync.Mutex
	remaining *sql.Stmt // prepared by the first Join
	closed    bool
	idleQueue []*queueConn // queue connections kept for reuse
	queueOut  int          // queue connections out of the pool

	beforeGrab func(first bool) // a test's hook (export_test.go); nil otherwise
}

// New returns the Line of a Locker on table whose waiters poll, where the
// named lock cannot help, from minPoll doubling to maxPoll (the Locker's
// Config; zero: its defaults).
func New(table *memtable.Table, minPoll, maxPoll time.Duration) *Queue {
	if minPoll <= 0 {
		minPoll = time.Millisecond
	}
	if maxPoll <= 0 {
		maxPoll = 32 * time.Millisecond
	}
	return &Queue{table: table, minPoll: minPoll, maxPoll: max(maxPoll, minPoll)}
}

// remainingRow reads the holder's lease left, in µs (<= 0 or NULL, no row:
// free), whether the holder holds the key's named lock, and the connection
// that holds the named lock (NULL: nobody). Aggregates, so that a key
// without a row still gives one result row. Args: name, key.
const remainingRow = `SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MAX(expires_at)),
	COALESCE(MAX(owner LIKE 'q%'), 0), IS_USED_LOCK(?)
FROM oversold_leases WHERE lock_key = ?`

// Join takes a queue connection for key's Acquire, or none when
// maxQueueConns are out (the Acquire polls instead).
func (l *Queue) Join(ctx context.Context, key string) (mysqllock.Turn, error) {
	if err := l.prepare(ctx); err != nil {
		return nil, err
	}
	qc, err := l.takeQueueConn(ctx)
	if err != nil {
		return nil, err
	}
	t := &turn{l: l, key: key, q: QueueName(key), qc: qc, first: qc != nil, poll: l.minPoll}
	if t.first && l.beforeGrab != nil {
		l.beforeGrab(true)
	}
	return t, nil
}

func (l *Queue) prepare(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.remaining != nil {
		return nil
	}
	st, err := l.table.DB().PrepareContext(ctx, remainingRow)
	l.remaining = st
	return err
}

// Close closes the idle queue connections; those out close as they come
// back.
func (l *Queue) Close() {
	l.mu.Lock()
	l.closed = true
	st := l.remaining
	l.mu.Unlock()
	l.closeIdleQueue()
	if st != nil {
		st.Close()
	}
}

// staleName is how long one connection must hold the key's named lock,
// the row free all along, before a waiter grabs without the named lock:
// long next to a waiter's grab or poll (MaxPoll), whose slowness under
// load would otherwise pass for a paused holder and let waiters barge,
// and short next to the TTL the paused holder's lease already took.
func (l *Queue) staleName() time.Duration {
	return max(2*l.maxPoll, l.table.TTL()/10)
}

// maxBoots bounds the epochs one Acquire learns: a server restarting over
// and over fails it instead of looping.
const maxBoots = 3

// turn is one Acquire's place in its key's line, then its lease's.
type turn struct {
	l      *Queue
	key    string
	q      string     // the key's named lock: its line
	qc     *queueConn // nil once given back, or when there is no queue
	queued bool       // we hold q: first in line
	poll   time.Duration

	first   bool // the next grab is the first on qc (grabQueued)
	refused bool // the last plain grab was refused
	noEpoch bool // the last grab's epoch was not the run's: learn it
	reopen  bool // qc was found dead by the first grab: take a fresh one
	reopens int
	boots   int
	granted bool // a grab won: Free frees through qc, if we have it
	// stale is who held q, the row free, when we first saw it so, and
	// since when.
	stale struct {
		name  int64
		since time.Time
	}
}

// Try grabs: the first time on qc, the row and q in one statement; then
// the row alone. A grant that does not hold q gives qc back at once.
func (t *turn) Try(ctx context.Context) (string, uint64, error) {
	if t.first {
		return t.tryFirst(ctx)
	}
	owner := mysqllock.NewOwner(unqueuedOwner)
	if t.queued {
		owner = mysqllock.NewOwner(queuedOwner)
	}
	token, err := t.l.table.Grab(ctx, t.key, owner)
	switch {
	case errors.Is(err, memtable.ErrNoEpoch) && t.boots < maxBoots:
		// The server restarted, or another Locker learned of it first.
		t.boots++
		t.noEpoch = true
		return "", 0, nil
	case errors.Is(err, memtable.ErrNoEpoch):
		return "", 0, err // nothing was granted
	case err != nil:
		return owner, 0, err
	case token == 0:
		t.refused = true
		return owner, 0, nil
	}
	t.granted = true
	if !t.queued {
		t.l.putQueueConn(t.qc, true)
		t.qc = nil
	}
	return owner, token, nil
}

// tryFirst is the first grab, on qc. q is free unless the key is held or
// waited for: then it takes neither, and Wait joins the line. Both free
// (an uncontended key), one statement takes both.
func (t *turn) tryFirst(ctx context.Context) (string, uint64, error) {
	t.first = false
	owner := mysqllock.NewOwner(queuedOwner)
	g, err := t.l.grabQueued(ctx, t.key, owner, t.qc)
	if err != nil && connLost(err) && t.reopens == 0 {
		// An idle queue connection the server dropped (a restart, its
		// wait_timeout, a KILL): so are its idle peers, likely. Wait
		// tries once more on a fresh one.
		t.l.table.Free(ctx, t.key, owner) // best effort, as after any failed grab
		t.reopen = true
		return "", 0, nil
	}
	if err != nil {
		return owner, 0, err
	}
	t.queued = g.queued
	if g.token != 0 {
		t.granted = true
	}
	return owner, g.token, nil
}

// Wait waits until the key may be free: learning a new server run's
// epoch, in line on q when the holder will wake us, else polling.
func (t *turn) Wait(ctx context.Context) error {
	switch {
	case t.reopen:
		t.reopen, t.reopens = false, t.reopens+1
		t.l.putQueueConn(t.qc, false)
		t.l.closeIdleQueue()
		qc, err := t.l.takeQueueConn(ctx)
		if err != nil {
			return err
		}
		t.qc, t.first, t.queued = qc, qc != nil, false
		if t.first && t.l.beforeGrab != nil {
			t.l.beforeGrab(true)
		}
		return nil
	case t.noEpoch:
		t.noEpoch = false
		if err := t.l.table.LearnEpoch(ctx); err != nil {
			return err
		}
	case t.refused && (t.qc == nil || t.queued):
		// First in line behind a holder that will not wake us (its
		// connection died, or it came in unqueued), or no queue at all.
		if err := t.pollUntilFree(ctx); err != nil {
			return err
		}
	}
	t.refused = false
	for t.qc != nil && !t.queued {
		again, err := t.waitInLine(ctx)
		if err != nil {
			return err
		}
		if !again {
			break
		}
	}
	if t.l.beforeGrab != nil {
		t.l.beforeGrab(false)
	}
	return nil
}

// waitInLine waits, not yet first in line, until the row may be grabbed:
// on q when the holder will wake us, else polling. again says to look
// again before grabbing.
func (t *turn) waitInLine(ctx context.Context) (again bool, err error) {
	l := t.l
	ws, err := l.readState(ctx, t.key)
	if err != nil {
		return false, err
	}
	if ws.left > 0 || ws.nameHolder != t.stale.name {
		t.stale.name, t.stale.since = 0, time.Time{}
		if ws.left <= 0 {
			t.stale.name, t.stale.since = ws.nameHolder, time.Now()
		}
	}
	wait := ws.left
	switch {
	case ws.left > 0 && !ws.holderQueued:
		// Its holder will not wake us: poll.
		if err := clock.Sleep(ctx, min(mysqllock.Jitter(t.poll), ws.left)); err != nil {
			return false, err
		}
		t.poll = min(2*t.poll, l.maxPoll)
		return true, nil
	case ws.left <= 0 && ws.nameHolder != 0 && time.Since(t.stale.since) >= l.staleName():
		// Free, and q held by the same connection all along: not a
		// waiter about to grab but a holder paused past its lease,
		// still connected. Grab without q.
		wait = 0
	case ws.left <= 0:
		// Free, yet q is taken: by the waiter it went to, about to grab
		// (or by a waiter polling behind a holder that came in without
		// q). Do not barge: wait in line, and look again after MaxPoll.
		wait = l.maxPoll
	}
	if wait > 0 {
		// Wait no longer than the holder's lease: it may expire.
		if t.queued, err = t.qc.lock(ctx, t.q, min(wait, l.table.TTL())); err != nil {
			return false, err
		}
		if !t.queued {
			return true, nil // renewed, expired or still free: look again
		}
	}
	return false, nil
}

// pollUntilFree polls the holder's lease until it looks free.
func (t *turn) pollUntilFree(ctx context.Context) error {
	for left := t.l.maxPoll; left > 0; {
		if err := clock.Sleep(ctx, min(mysqllock.Jitter(t.poll), left)); err != nil {
			return err
		}
		t.poll = min(2*t.poll, t.l.maxPoll)
		ws, err := t.l.readState(ctx, t.key)
		if err != nil {
			return err
		}
		left = ws.left
	}
	return nil
}

// waitState is what remainingRow reads: the holder's lease left (<= 0
// when free), whether the holder holds the key's named lock, and which
// connection holds the named lock (0: nobody).
type waitState struct {
	left         time.Duration
	holderQueued bool
	nameHolder   int64
}

// readState reads the key's waitState. A read may be abandoned, so it runs
// on the caller's ctx, bounded by TTL/3 like every statement here: a
// database that slow cannot keep leases.
func (l *Queue) readState(ctx context.Context, key string) (waitState, error) {
	rctx, cancel := context.WithTimeout(ctx, l.table.TTL()/3)
	defer cancel()
	var (
		us, holder sql.NullInt64
		ws         waitState
	)
	err := l.remaining.QueryRowContext(rctx, QueueName(key), key).Scan(&us, &ws.holderQueued, &holder)
	ws.left = time.Duration(us.Int64) * time.Microsecond
	ws.nameHolder = holder.Int64
	return ws, err
}

// Free frees owner's row, and gives up q if it holds it: in the same
// statement when it frees the row, else on its own. A grab that did not
// win, or a turn without qc, frees through the pool.
func (t *turn) Free(ctx context.Context, owner string) error {
	qc := t.qc
	if qc == nil || !t.granted {
		return t.l.table.Free(ctx, t.key, owner)
	}
	t.qc = nil
	err := mysqllock.RowsOrNotHeld(qc.free.ExecContext(ctx, t.key, owner))
	clean := err == nil // the statement released the named lock
	switch {
	case err != nil && !errors.Is(err, locking.ErrNotHeld) && connLost(err):
		// The connection died while we held the key (a KILL, a proxy's
		// reset), and its named lock with it; our row is likely still
		// there, and would block the key for the rest of its lease:
		// free it through the pool.
		err = t.l.table.Free(ctx, t.key, owner)
	case err != nil:
		// Whether it reached RELEASE_ALL_LOCKS is unknown: make sure.
		clean = qc.unlock(ctx) == nil
	}
	t.l.putQueueConn(qc, clean)
	return err
}

// Close gives qc back, closed: it may hold q, or be broken by a cancelled
// wait.
func (t *turn) Close() {
	t.l.putQueueConn(t.qc, false)
	t.qc = nil
}

// grabbed is a grab's outcome on a queue connection: the token won (0:
// none), and whether the grab took the key's named lock.
type grabbed struct {
	token  uint64
	queued bool
}

// grabQueued runs the first grab of an Acquire on qc: the row and the
// key's named lock in one statement when both are free. 0 rows: neither
// is ours (the named lock is taken, or our epoch is not the run's: the
// plain grab learns that). A duplicate: the named lock is ours, the row
// someone's.
func (l *Queue) grabQueued(ctx context.Context, key, owner string, qc *queueConn) (grabbed, error) {
	epoch := l.table.Epoch()
	ttl := l.table.TTL().Microseconds()
	res, err := qc.grab.ExecContext(ctx, key, owner, ttl, epoch, QueueName(key))
	if again, serr := l.table.Swept(ctx, err, 0); again {
		res, err = qc.grab.ExecContext(ctx, key, owner, ttl, epoch, QueueName(key))
		_, err = l.table.Swept(ctx, err, 1)
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
	token, err := memtable.TokenOf(epoch, res)
	return grabbed{token: token, queued: true}, err
}

// erDupEntry is ER_DUP_ENTRY: the key's row exists.
const erDupEntry = 1062

// errClosed: the Locker is closing; no queue connection is handed out.
var errClosed = errors.New("locker closed")

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
