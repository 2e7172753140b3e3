package mysqllock

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"time"
)

// The wait queue: waiters block in GET_LOCK on a name derived from the key
// (a named lock held by the lease holder), so a release wakes the next one
// at once instead of leaving the key idle until somebody's next poll.
//
// The named lock is only a wake-up: the row decides who holds the key,
// so mutual exclusion, tokens, renewal and Lost do not depend on it. A
// holder takes the named lock before its grab and gives it up when it ends
// its lease; a waiter that wins the named lock grabs the row. The release
// mark (handOver) does grant: a row whose owner's mark is held is free. It
// is safe because only that owner's Release takes the mark, after its
// renewals stopped, and owners are random per grant; a mark that vanishes
// early (its connection died) only makes the row wait for its expiry. Whatever goes wrong with the named lock (a holder
// paused past its lease still holding it, a connection killed, no queue
// connection to spare) costs a wait bounded by the row's lease, or falls
// back to polling; the owner column says whether its holder holds the named
// lock ("q" prefix), so waiters block only behind a holder that will wake
// them and poll behind any other.
//
// A named lock belongs to a connection, so a queued Acquire takes one
// connection out of the pool for itself (a queue connection), and keeps it
// with the lease until Release. At most maxQueueConns are out at once, so
// that renewals always find a pooled connection; Acquires beyond that poll.

// maxQueueConns bounds the connections out of the pool for the queue; the
// rest of the pool serves grabs, reads and renewals. backends.Open sizes
// the pool at 32.
const maxQueueConns = 16

// maxIdleQueueConns is how many queue connections are kept for reuse.
const maxIdleQueueConns = 4

// Owner prefixes: a holder that holds the key's named lock, and one that
// does not (it polled its way in).
const (
	queuedOwner   = 'q'
	unqueuedOwner = 'p'
)

// queueConn is a connection out of the pool, with its named-lock statements.
type queueConn struct {
	conn                   *sql.Conn
	get, rel, hand, unmark *sql.Stmt
}

// handOver ends a queued lease without writing the row, so without a
// commit to flush: it marks the lease released with a named lock of its own
// (releaseName, on the queue connection), then releases the key's named
// lock, waking the next waiter, whose grab takes the row over because the
// mark is held. One commit per handoff (the grant's), where freeing the row
// cost a second. The held check comes first, so a lease that already lapsed
// marks nothing; CASE evaluates in order, so the mark exists before anyone
// wakes. Answers 10 + RELEASE_LOCK (not held; the named lock given up),
// 20 + RELEASE_LOCK (handed over), or 0 (no mark: the named lock is kept).
// Args: key, owner, queue name, release name, queue name.
const handOver = `SELECT CASE
	WHEN NOT EXISTS (SELECT 1 FROM oversold_locks WHERE lock_key = ? AND owner = ? AND expires_at >= UTC_TIMESTAMP(6))
		THEN 10 + COALESCE(RELEASE_LOCK(?), 0)
	WHEN GET_LOCK(?, 0) = 1 THEN 20 + COALESCE(RELEASE_LOCK(?), 0)
	ELSE 0 END`

// unmark ends a handed-over lease's linger (on the connection holding the
// mark): it frees the row if it is still the lease's (nobody took it over)
// and gives up the mark, in one statement. The mark goes while the
// statement holds the row's lock, before its commit, so a grab that did
// not see the mark waits for the commit and finds the row freed. The
// product with 0 keeps RELEASE_LOCK evaluated whatever the row says.
// Args: key, release name, owner.
const unmark = `UPDATE oversold_locks SET owner = '', expires_at = '1970-01-01'
WHERE lock_key = ? AND 0 * COALESCE(RELEASE_LOCK(?), 0) + (owner = ? AND expires_at >= UTC_TIMESTAMP(6))`

// releasePrefix + owner names the mark of a lease handed over. Only
// handOver takes it, after its holder stopped using the lease, so while it
// is held the row is as good as free; it goes once the row is freed or
// taken over (linger). Owners are 32 characters: 45 of GET_LOCK's 64.
const releasePrefix = "oversold_rel/"

func releaseName(owner string) string { return releasePrefix + owner }

// A handed-over row stays written as its holder's while its mark is held:
// releaseLinger, the time a woken waiter needs to take it over in its grab.
// Then the row is freed for good, which writes (and flushes) only if nobody
// took it over: an UPDATE that matches no row commits without a redo write.
// At most maxLingering connections linger; beyond that the row is freed at
// once, off the caller's path still.
const (
	releaseLinger = 5 * time.Millisecond
	maxLingering  = 4
)

// queueName is the named lock of key: GET_LOCK names are at most 64
// characters, keys up to 255 bytes, so the name carries a hash. A
// collision only shares a queue, which costs waits, never exclusion.
func queueName(key string) string {
	h := sha256.Sum256([]byte(key))
	return "oversold_locks/" + hex.EncodeToString(h[:16])
}

// takeQueueConn returns a queue connection, or nil when maxQueueConns are
// out (the caller polls instead).
func (l *Locker) takeQueueConn(ctx context.Context) (*queueConn, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, errClosed
	}
	if n := len(l.idleQueue); n > 0 {
		qc := l.idleQueue[n-1]
		l.idleQueue = l.idleQueue[:n-1]
		l.queueOut++
		l.mu.Unlock()
		return qc, nil
	}
	if l.queueOut >= maxQueueConns {
		l.mu.Unlock()
		return nil, nil
	}
	l.queueOut++
	l.mu.Unlock()
	qc, err := l.openQueueConn(ctx)
	if err != nil {
		l.mu.Lock()
		l.queueOut--
		l.mu.Unlock()
		return nil, err
	}
	return qc, nil
}

func (l *Locker) openQueueConn(ctx context.Context) (*queueConn, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.TTL/3)
	defer cancel()
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	qc := &queueConn{conn: conn}
	if qc.get, err = conn.PrepareContext(ctx, "SELECT GET_LOCK(?, ?)"); err == nil {
		qc.rel, err = conn.PrepareContext(ctx, "SELECT RELEASE_LOCK(?)")
	}
	if err == nil {
		qc.hand, err = conn.PrepareContext(ctx, handOver)
	}
	if err == nil {
		qc.unmark, err = conn.PrepareContext(ctx, unmark)
	}
	if err != nil {
		qc.discard()
		return nil, err
	}
	return qc, nil
}

// putQueueConn gives qc back: kept for reuse if clean (it holds no named
// lock), else closed, which frees whatever it holds on the server.
func (l *Locker) putQueueConn(qc *queueConn, clean bool) {
	if qc == nil {
		return
	}
	l.mu.Lock()
	l.queueOut--
	keep := clean && !l.closed && len(l.idleQueue) < maxIdleQueueConns
	if keep {
		l.idleQueue = append(l.idleQueue, qc)
	}
	l.mu.Unlock()
	if !keep {
		qc.discard()
	}
}

// closeIdleQueue closes the idle queue connections (Close).
func (l *Locker) closeIdleQueue() {
	l.mu.Lock()
	idle := l.idleQueue
	l.idleQueue = nil
	l.mu.Unlock()
	for _, qc := range idle {
		qc.discard()
	}
}

// discard closes the connection itself rather than returning it to the
// pool: a pooled connection must not carry a named lock.
func (qc *queueConn) discard() {
	for _, st := range []*sql.Stmt{qc.get, qc.rel, qc.hand, qc.unmark} {
		if st != nil {
			st.Close()
		}
	}
	qc.conn.Raw(func(any) error { return driver.ErrBadConn })
	qc.conn.Close()
}

// lock waits up to wait for the named lock q: true when it is ours. A wait
// ended by ctx closes the connection (the driver's cancel), freeing q.
func (qc *queueConn) lock(ctx context.Context, q string, wait time.Duration) (bool, error) {
	var got sql.NullInt64
	if err := qc.get.QueryRowContext(ctx, q, wait.Seconds()).Scan(&got); err != nil {
		return false, err
	}
	if !got.Valid {
		return false, errors.New("GET_LOCK returned NULL")
	}
	return got.Int64 == 1, nil
}

// unlock frees the named lock q; false when it was not held.
func (qc *queueConn) unlock(ctx context.Context, q string) (bool, error) {
	var ok sql.NullInt64
	if err := qc.rel.QueryRowContext(ctx, q).Scan(&ok); err != nil {
		return false, err
	}
	return ok.Valid && ok.Int64 == 1, nil
}
