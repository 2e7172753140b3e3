// Package mysqllock is a lease lock kept in a MySQL table, beside the data
// it protects: one row per key with its owner, its expiry (the database's
// clock) and a token bumped on every grant.
//
// Acquire is a short loop: try (one conditional statement takes the row if
// it is free or expired), granted? (hold it: renew every TTL/3 through
// keepalive, Lost closes when the lease may have run out), else wait (a
// jittered backoff from MinPoll doubling to MaxPoll). Renewal and Release
// match only the caller's own unexpired row, so neither revives an expired
// lease nor touches a newer holder's. The token is the row's counter: it
// grows with every grant of the key and is never reset (released rows
// stay), so storage can fence writes of a holder that outlived its lease.
//
// The grab statement is never abandoned halfway: it runs on a context the
// caller cannot cancel (bounded by TTL/3), and a grant won as the caller
// gave up is freed at once on a fresh bounded context.
//
// This package is the recipe, complete and correct on its own (rows.go).
// Two small interfaces plug in what it leaves out: a Table (where rows
// live; memtable keeps them in a MEMORY table with epoch tokens, so a grant
// writes nothing to disk) and a Line (how waiters wait; namedqueue wakes
// them with GET_LOCK). serverguard refuses servers that could lose a
// token in a crash. locking/backends composes them. Failure modes,
// sources and reasoning: docs/locks/mysql.md.
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
	// Table keeps the rows; nil: the recipe's (rows.go) on the Locker's db.
	Table Table
	// Line is where Acquires wait; nil: polling (rows.go).
	Line Line
}

// Table keeps one row per key. Its statements run on the ctx they get.
type Table interface {
	// Prepare creates the table and prepares statements; Acquire calls it
	// until it succeeds once.
	Prepare(ctx context.Context) error
	// Try takes key for owner in one statement if the row is free or
	// expired: the new token, or 0 when someone else holds the key.
	Try(ctx context.Context, key, owner string) (token uint64, err error)
	// Renew extends owner's unexpired lease by the TTL, Free ends it:
	// ErrNotHeld when the row is not owner's, or expired.
	Renew(ctx context.Context, key, owner string) error
	Free(ctx context.Context, key, owner string) error
	Close() error
}

// Line is where Acquires wait for their keys.
type Line interface {
	Join(ctx context.Context, key string) (Turn, error)
	Close() // at Locker.Close, after no Acquire can join any more
}

// Turn is one Acquire's way to its key, then its lease's until Release.
type Turn interface {
	// Try grabs once (Table.Try, or a statement of its own) and says as
	// whom: the owner is freed if the caller gave up meanwhile.
	Try(ctx context.Context) (owner string, token uint64, err error)
	// Wait returns when the key may be free.
	Wait(ctx context.Context) error
	// Free ends owner's lease (Release, or a grant nobody wants).
	Free(ctx context.Context, owner string) error
	// Close gives back what the turn holds: the Acquire failed, or the
	// Locker closed.
	Close()
}

// MaxKeyLen is the longest key, in bytes, the tables store.
const MaxKeyLen = 255

// Locker grants leases from the lock table in db. It is safe for
// concurrent use.
type Locker struct {
	cfg      Config
	prepMu   sync.Mutex
	prepared atomic.Bool

	mu         sync.Mutex
	leases     map[*lease]struct{} // held, so that Close can end their renewals
	closed     bool
	background sync.WaitGroup // grabs and their holds under way, for Close
}

// New returns a Locker on db, a go-sql-driver/mysql pool. It does no I/O:
// the first Acquire creates the table.
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
	if cfg.Table == nil {
		cfg.Table = &rows{db: db, ttl: cfg.TTL}
	}
	if cfg.Line == nil {
		cfg.Line = polling{cfg}
	}
	return &Locker{cfg: cfg, leases: make(map[*lease]struct{})}
}

// Acquire takes the lock on key: try, granted?, else wait and try again.
func (l *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if len(key) > MaxKeyLen {
		return nil, fmt.Errorf("acquire %q: key longer than %d bytes", key, MaxKeyLen)
	}
	if err := l.prepare(ctx); err != nil {
		return nil, l.failed(ctx, key, err)
	}
	turn, err := l.cfg.Line.Join(ctx, key)
	if err != nil {
		return nil, l.failed(ctx, key, err)
	}
	for {
		sent := time.Now()
		owner, token, err := l.try(ctx, turn)
		if err == nil && token != 0 {
			return l.hold(key, owner, token, sent, turn)
		}
		if err == nil {
			err = turn.Wait(ctx)
		}
		if err != nil {
			turn.Close()
			return nil, l.failed(ctx, key, err)
		}
	}
}

// try runs one grab to its end on a context the caller cannot cancel: a
// statement abandoned in flight may still commit on the server after our
// cleanup ran. A grant won as ctx ended, and an unknown outcome, are freed.
// A grant goes on to hold, which calls l.background.Done, so that Close
// waits for it before closing the table.
func (l *Locker) try(ctx context.Context, turn Turn) (string, uint64, error) {
	if err := ctx.Err(); err != nil {
		return "", 0, err // a row won now would only be freed again
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return "", 0, errClosed
	}
	l.background.Add(1) // under mu: Close waits only after no more can start
	l.mu.Unlock()
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.TTL/3)
	defer cancel()
	owner, token, err := turn.Try(gctx)
	if token != 0 && ctx.Err() == nil && err == nil {
		return owner, token, nil
	}
	if token != 0 {
		token, err = 0, ctx.Err()
	}
	if err != nil && owner != "" {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.TTL/3)
		turn.Free(fctx, owner) // best effort: a row it misses expires within TTL
		cancel()
	}
	l.background.Done()
	return "", 0, err
}

// hold starts renewing a lease granted by a statement sent at sent. A
// grant that lands while Close runs is freed at once.
func (l *Locker) hold(key, owner string, token uint64, sent time.Time, turn Turn) (locking.Lease, error) {
	defer l.background.Done()
	s := &lease{locker: l, key: key, owner: owner, token: token, turn: turn}
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
	if closed {
		s.keepalive.Stop()
		s.keepalive.MarkLost()
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL/3)
		defer cancel()
		turn.Free(ctx, owner) // best effort: a row it misses expires within TTL
		turn.Close()
		return nil, l.failed(ctx, key, errClosed)
	}
	return s, nil
}

var errClosed = errors.New("locker closed")

// prepareTimeout bounds the one-time setup, which may create the table.
const prepareTimeout = 10 * time.Second

// prepare readies the table once; a failure is retried by the next Acquire.
func (l *Locker) prepare(ctx context.Context) error {
	if l.prepared.Load() {
		return nil
	}
	l.prepMu.Lock()
	defer l.prepMu.Unlock()
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return errClosed
	}
	if l.prepared.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, prepareTimeout)
	defer cancel()
	if err := l.cfg.Table.Prepare(ctx); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	l.prepared.Store(true)
	return nil
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

// Close stops renewing the leases still held and closes their Lost
// channels; their rows expire within TTL. It waits for the grabs under way
// (a grant landing now is freed), then closes the table, not the db.
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
		s.turn.Close()
		s.mu.Unlock()
	}
	l.cfg.Line.Close()
	l.background.Wait()
	l.prepMu.Lock()
	defer l.prepMu.Unlock()
	return l.cfg.Table.Close()
}

type lease struct {
	locker    *Locker
	key       string
	owner     string
	token     uint64
	turn      Turn
	keepalive *keepalive.Watchdog

	mu       sync.Mutex
	released bool
}

func (s *lease) Key() string           { return s.key }
func (s *lease) Token() uint64         { return s.token }
func (s *lease) Lost() <-chan struct{} { return s.keepalive.Lost() }

func (s *lease) renew(ctx context.Context) error {
	return s.locker.cfg.Table.Renew(ctx, s.key, s.owner)
}

// Release stops renewal, then frees the row if it is still ours. After a
// failure to reach the database it may be called again.
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
	err := s.turn.Free(ctx, s.owner)
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

// NewOwner returns a grab's identity on the row: prefix, then random hex
// digits, 32 characters in all.
func NewOwner(prefix byte) string {
	var b [32]byte
	b[0] = prefix
	var r [16]byte
	rand.Read(r[:]) // never fails (crypto/rand, Go 1.24+)
	hex.Encode(b[1:], r[:15])
	b[31] = "0123456789abcdef"[r[15]&15]
	return string(b[:])
}

// Jitter returns a duration in [d/2, d): waiters that started together
// spread out instead of polling in lockstep.
func Jitter(d time.Duration) time.Duration {
	if d < 2 {
		return d
	}
	return d/2 + mrand.N(d/2)
}

// polling is the default Line: each Acquire polls with a bounded backoff.
type polling struct{ cfg Config }

func (p polling) Join(_ context.Context, key string) (Turn, error) {
	return &pollTurn{cfg: p.cfg, key: key}, nil
}
func (p polling) Close() {}

type pollTurn struct {
	cfg  Config
	key  string
	poll time.Duration
}

func (t *pollTurn) Try(ctx context.Context) (string, uint64, error) {
	owner := NewOwner('p')
	token, err := t.cfg.Table.Try(ctx, t.key, owner)
	return owner, token, err
}

func (t *pollTurn) Wait(ctx context.Context) error {
	t.poll = min(max(2*t.poll, t.cfg.MinPoll), t.cfg.MaxPoll)
	return clock.Sleep(ctx, Jitter(t.poll))
}

func (t *pollTurn) Free(ctx context.Context, owner string) error {
	return t.cfg.Table.Free(ctx, t.key, owner)
}

func (t *pollTurn) Close() {}
