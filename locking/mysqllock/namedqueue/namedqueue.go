// Package namedqueue wakes the mysql lock's waiters at once: a
// mysqllock.Line where waiters block in GET_LOCK on a name derived from the
// key, held by the lease holder and given up in the statement that deletes
// its row, instead of leaving the key idle until somebody's next poll.
//
// The named lock is only a wake-up: the row alone decides who holds the
// key (memtable), so mutual exclusion, tokens, renewal and Lost do not
// depend on it. A holder takes the named lock with its grab (one
// statement, when both are free) and gives it up with its row; a waiter
// that wins the named lock grabs the row. A waiter that finds the row free
// while someone holds the named lock (the waiter it just went to, about to
// grab) waits in line too; it grabs without the named lock only when one
// connection has held it, the row free, for max(2 MaxPoll, TTL/10): a
// holder paused past its lease, still connected. Whatever else goes wrong
// with the named lock (a connection killed, no queue connection to spare)
// costs a wait bounded by the row's lease, or falls back to polling; the
// owner column says whether its holder holds the named lock ("q" prefix),
// so waiters block only behind a holder that will wake them.
//
// A named lock belongs to a connection, so a queued Acquire takes one
// connection out of the pool (a queue connection) and keeps it with the
// lease until Release; at most maxQueueConns are out at once, so that
// renewals always find a pooled connection. What it buys: on a hot key
// every grant goes to a woken waiter (TestHotKeyDoesNotBarge), and an
// uncontended turn costs two statements, as GET_LOCK and RELEASE_LOCK do.
package namedqueue

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"time"
)

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
	conn                 *sql.Conn
	grab, get, rel, free *sql.Stmt
}

// freeQueued is memtable's free that also releases the named lock,
// after the row is matched and before it is deleted: the waiter it wakes
// sends its grab at once, which waits for the MEMORY table's lock until
// this statement ends and then finds the row gone. RELEASE_ALL_LOCKS
// returns a count, so the condition it adds is always true; it frees every
// count of the one named lock a queue connection holds (its key's; a lock
// taken twice by one connection is counted twice). When the row does not
// match, the caller releases the named lock on its own. (RELEASE_ALL_LOCKS
// makes the statement unsafe for statement-based binlogs: MIXED logs it by
// row.) Args: key, owner.
const freeQueued = `DELETE FROM oversold_leases
WHERE lock_key = ? AND owner = ? AND expires_at >= UTC_TIMESTAMP(6)
	AND COALESCE(RELEASE_ALL_LOCKS(), 0) >= 0`

// grabQueued is memtable's grab on a queue connection that also takes
// the key's named lock, in the first grab of an Acquire: one statement
// where an uncontended key would cost two. The epoch and grace, which the
// boot row (a const table) decides, are tested before GET_LOCK, so a
// wrong epoch takes neither. (GET_LOCK makes the statement unsafe for
// statement-based binlogs: MIXED logs it by row.)
// Args: key, owner, ttl µs, epoch, name.
const grabQueued = `INSERT INTO oversold_leases (lock_key, epoch, owner, expires_at)
SELECT ?, epoch, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND FROM oversold_lock_boot
WHERE id = 1 AND epoch = ? AND epoch > 0 AND grace_until <= UTC_TIMESTAMP(6) AND GET_LOCK(?, 0) = 1`

// QueueName is the named lock of key: GET_LOCK names are at most 64
// characters, keys up to 255 bytes, so the name carries a hash. A
// collision only shares a queue, which costs waits, never exclusion.
func QueueName(key string) string {
	h := sha256.Sum256([]byte(key))
	return "oversold_locks/" + hex.EncodeToString(h[:16])
}

// takeQueueConn returns a queue connection, or nil when maxQueueConns are
// out (the caller polls instead).
func (l *Queue) takeQueueConn(ctx context.Context) (*queueConn, error) {
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

func (l *Queue) openQueueConn(ctx context.Context) (*queueConn, error) {
	ctx, cancel := context.WithTimeout(ctx, l.table.TTL()/3)
	defer cancel()
	conn, err := l.table.DB().Conn(ctx)
	if err != nil {
		return nil, err
	}
	qc := &queueConn{conn: conn}
	if qc.grab, err = conn.PrepareContext(ctx, grabQueued); err == nil {
		qc.get, err = conn.PrepareContext(ctx, "SELECT GET_LOCK(?, ?)")
	}
	if err == nil {
		qc.rel, err = conn.PrepareContext(ctx, "SELECT RELEASE_ALL_LOCKS()")
	}
	if err == nil {
		qc.free, err = conn.PrepareContext(ctx, freeQueued)
	}
	if err != nil {
		qc.discard()
		return nil, err
	}
	return qc, nil
}

// putQueueConn gives qc back: kept for reuse if clean (it holds no named
// lock), else closed, which frees whatever it holds on the server.
func (l *Queue) putQueueConn(qc *queueConn, clean bool) {
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
func (l *Queue) closeIdleQueue() {
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
	for _, st := range []*sql.Stmt{qc.grab, qc.get, qc.rel, qc.free} {
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

// unlock frees the named locks qc holds: only ever its key's, but every
// count of it (MariaDB and MySQL count a named lock taken twice).
func (qc *queueConn) unlock(ctx context.Context) error {
	var n sql.NullInt64
	return qc.rel.QueryRowContext(ctx).Scan(&n)
}
