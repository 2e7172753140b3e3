// Package redislock is a lock on one Redis server (a standalone server, a
// Sentinel-managed master, or a Cluster), with a fencing token, a watchdog
// and waiters woken by pub/sub.
//
// # How it works
//
// A key k lives at "lock:{k}" (the prefix is configurable). Acquire runs one
// Lua script: SET lock owner NX PX ttl, with a random 128-bit owner, and on
// success INCR of the counter "lock:{k}:fence", whose value is the lease's
// fencing token. The hash tag {k} keeps the lock, its counter and its
// channel in one Cluster slot. A granted lease is renewed every TTL/3 by a
// script that extends the key only while it still holds the lease's owner
// (locking.Keepalive), and Release deletes the key by the same owner check,
// publishing on "lock:{k}:released" in the same script.
//
// A try that fails also queues the waiter, in the same script: a sorted
// set "lock:{k}:waiters" whose members name the waiter and its Locker, scored
// by a deadline (the server's time plus twice the longest fallback wait)
// that every try pushes back. Release, in its script, drops the expired entries (waiters
// that died or stopped trying), pops the first entry left, the waiter that
// tried least recently, and publishes its name on that Locker's channel
// "lock:{k}:wake:<locker id>". So a release wakes exactly one waiter in the
// whole system, not one per process: on a hot key with 32 processes the
// other 30 no longer run a try that can only fail. (Redisson's FairLock
// queues waiters too, but also bars newcomers; here a newcomer may still
// take a free lock first, which keeps a hot key busy, and the woken waiter
// that lost such a race queues again.)
//
// A waiter subscribes to its Locker's channel before it waits, and waits
// until the server has confirmed the subscription and tries again: a release
// in between is then either seen by that try or heard as a message, never
// lost. (On a hot key the channel is subscribed already, and a waiter joins
// it before its first try, which saves the second.) All waiters of a Locker
// share one subscription connection (Notifier), which wakes the waiter the
// message names. A waiter also keeps a fallback timer, a jittered
// exponential backoff (Config.MinBackoff to MaxBackoff) capped by the
// holder's remaining TTL, which the failed try returned: a holder that died
// is replaced as soon as its key expires, with no message at all (Redisson
// waits the same way), and a release whose wake-up went to a dead waiter
// costs the others one fallback wait, no more. A waiter that gives up (ctx,
// Close) leaves the queue and, if the lock is free, passes the wake-up on to
// the next waiter, in one script.
//
// # Failure modes
//
//   - A holder paused past its TTL (GC, SIGSTOP, swap) or cut off from Redis
//     loses its lease while it still believes it holds it. Lost closes when
//     the validity measured from the send time of the last confirmed
//     renewal, minus a drift margin, runs out, which is before Redis can
//     expire the key; but a paused process cannot look, so two holders can
//     still overlap. Only the fencing token makes writes safe then.
//   - A Sentinel or Cluster failover loses writes that were not yet
//     replicated: the new master may grant a lock that is still held. The
//     replica's fence counter may be behind too, so a token can be handed out
//     twice. A storage guard "fence < token" then refuses the repeated token:
//     the second writer fails (lock lost), it does not overwrite.
//   - Redis expires keys by its wall clock: a clock jumping forward on the
//     server ends leases early. The token catches that case as well.
//   - Redis unreachable: Acquire fails with locking.ErrUnavailable, renewals
//     fail and Lost closes when the validity runs out, and waiters fall back
//     on their timers until the subscription connection is back.
//   - A wait ended by ctx removes its own key (the try's reply may have been
//     lost after the SET) and its queue entry with a fresh, bounded context,
//     and unsubscribes. If that fails, the key and the entry expire.
//   - The scripts read the server's clock (TIME) before they write, which
//     needs Redis 5 or later (effects replication).
//
// # Token
//
// Token is the INCR of the per-key counter, in the same script as the SET:
// every grant gets a greater number than every earlier grant of the key, for
// as long as Redis keeps its data (persistence, and no failover that loses
// writes). The counter never expires; it costs one small key per lock key
// ever used. The queue of waiters expires with its last entry.
package redislock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/locking"
)

var _ locking.Locker = (*Locker)(nil)

// ErrClosed is returned by Acquire on a closed Locker.
var ErrClosed = errors.New("redislock: locker closed")

var (
	//go:embed acquire.lua
	acquireLua string
	//go:embed renew.lua
	renewLua string
	//go:embed release.lua
	releaseLua string

	acquireScript = redis.NewScript(acquireLua)
	renewScript   = redis.NewScript(renewLua)
	releaseScript = redis.NewScript(releaseLua)
)

// Config tunes a Locker. The zero value is usable.
type Config struct {
	// TTL is the lease time to live, renewed every TTL/3. 0 = 10s.
	TTL time.Duration
	// Prefix starts every Redis key of the Locker. "" = "lock:".
	Prefix string
	// MinBackoff and MaxBackoff bound the fallback timer of a waiter that
	// hears no release message; it never waits past the holder's remaining
	// TTL. 0 = 5ms and 1s.
	MinBackoff, MaxBackoff time.Duration
	// OnRenewalFailed, if set, hears every failed renewal (for metrics).
	OnRenewalFailed func(key string, err error)
}

func (c Config) withDefaults() Config {
	if c.TTL <= 0 {
		c.TTL = 10 * time.Second
	}
	if c.Prefix == "" {
		c.Prefix = "lock:"
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 5 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = time.Second
	}
	c.MaxBackoff = max(c.MaxBackoff, c.MinBackoff)
	return c
}

// queueLife is how long a waiter's queue entry outlives its last try: more
// than the longest fallback wait between two tries, so the entry of a live
// waiter does not expire, and that of a dead one soon does.
func (c Config) queueLife() time.Duration {
	return 2 * (c.MaxBackoff + c.MinBackoff)
}

// Locker grants leases on keys of one Redis server. It is safe for
// concurrent use.
type Locker struct {
	client   redis.UniversalClient
	cfg      Config
	id       string // names this Locker's waiters and wake channels
	ttl      string // cfg.TTL in milliseconds, as the scripts take it
	life     string // queueLife in milliseconds
	notifier *Notifier

	mu      sync.Mutex
	leases  map[*lease]struct{} // live leases, ended by Close
	closed  bool
	closing chan struct{}
}

// New returns a Locker on client. Close does not close the client.
func New(client redis.UniversalClient, cfg Config) *Locker {
	cfg = cfg.withDefaults()
	return &Locker{
		client:   client,
		cfg:      cfg,
		id:       newOwner()[:16],
		ttl:      strconv.FormatInt(cfg.TTL.Milliseconds(), 10),
		life:     strconv.FormatInt(cfg.queueLife().Milliseconds(), 10),
		notifier: NewNotifier(client),
		leases:   make(map[*lease]struct{}),
		closing:  make(chan struct{}),
	}
}

// names are the Redis names of one lock key, all in the hash slot of {key}:
// the lock, its fence counter, its queue of waiters, and the prefix of the
// channels that wake them (one per Locker: wake + Locker id).
type names struct{ lock, fence, waiters, wake string }

func (l *Locker) names(key string) names {
	lock := l.cfg.Prefix + "{" + key + "}"
	return names{lock: lock, fence: lock + ":fence", waiters: lock + ":waiters", wake: lock + ":wake:"}
}

// Acquire waits until the lock on key is granted, ctx ends, or Redis fails.
func (l *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if key == "" {
		// "{}" is no hash tag: the lock and its counter could land in
		// different Cluster slots.
		return nil, errors.New("acquire: empty key")
	}
	n := l.names(key)
	owner := newOwner()
	member := l.id + ":" + owner // our entry in the queue of waiters
	channel := n.wake + l.id
	var (
		wake = make(chan struct{}, 1)
		// Already subscribed (the key is hot): a failed try can wait at once.
		watch = l.notifier.JoinAs(channel, member, wake)
		timer *time.Timer
	)
	defer func() {
		if watch != nil {
			watch.Stop()
		}
		if timer != nil {
			timer.Stop()
		}
	}()
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			if attempt > 0 { // queued by the last try
				l.undo(ctx, n, owner, member)
			}
			return nil, fmt.Errorf("acquire %q: %w", key, err)
		}
		sent := time.Now()
		token, pttl, err := l.try(ctx, n, owner, member)
		if err != nil {
			// The SET may have happened with its reply lost: remove it.
			l.undo(ctx, n, owner, member)
			if ctx.Err() != nil {
				return nil, fmt.Errorf("acquire %q: %w", key, ctx.Err())
			}
			return nil, fmt.Errorf("acquire %q: %w: %w", key, locking.ErrUnavailable, err)
		}
		if token > 0 {
			select {
			case <-wake: // this grant used up the release we were told of
			default:
			}
			return l.grant(ctx, key, n, owner, token, sent)
		}
		woken := (<-chan struct{})(wake)
		if watch == nil {
			// Subscribe, and try again once the server confirms: a release
			// between the first try and the subscription is not lost.
			watch = l.notifier.WatchAs(channel, member, wake)
			woken = watch.Ready()
		}
		d := l.backoff(attempt, pttl)
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-woken:
		case <-timer.C:
		case <-ctx.Done():
			l.undo(ctx, n, owner, member)
			return nil, fmt.Errorf("acquire %q: %w", key, ctx.Err())
		case <-l.closing:
			l.undo(ctx, n, owner, member)
			return nil, fmt.Errorf("acquire %q: %w", key, ErrClosed)
		}
	}
}

// try runs the acquire script once. It returns the token if the lock was
// granted, or else the holder's remaining TTL (negative if unknown).
func (l *Locker) try(ctx context.Context, n names, owner, member string) (token uint64, pttl time.Duration, err error) {
	res, err := acquireScript.Run(ctx, l.client, []string{n.lock, n.fence, n.waiters}, owner, l.ttl, member, l.life).Int64Slice()
	if err != nil {
		return 0, 0, err
	}
	if len(res) != 2 {
		return 0, 0, fmt.Errorf("acquire script returned %v", res)
	}
	if res[0] == 1 {
		if res[1] <= 0 {
			return 0, 0, fmt.Errorf("fence counter %s is %d, not positive", n.fence, res[1])
		}
		return uint64(res[1]), 0, nil
	}
	return 0, time.Duration(res[1]) * time.Millisecond, nil
}

// backoff is the fallback wait before try number attempt+1: exponential
// with jitter (so waiters of several processes do not retry in step),
// capped by the holder's remaining TTL, after which the key is free.
func (l *Locker) backoff(attempt int, pttl time.Duration) time.Duration {
	d := l.cfg.MaxBackoff
	if attempt < 30 {
		d = min(d, l.cfg.MinBackoff<<attempt)
	}
	d = d/2 + mrand.N(d/2+1)
	if pttl >= 0 && pttl < d {
		d = pttl + mrand.N(l.cfg.MinBackoff)
	}
	return d
}

// undo ends a wait: it deletes the key if owner holds it (a try's reply may
// have been lost after the SET) and removes member from the queue, passing
// on the wake-up if the lock is free, with a fresh context bounded by the
// TTL (after which the key is gone anyway) and a second. If it fails, the
// key expires, and so does the queue entry (Config.queueLife).
func (l *Locker) undo(ctx context.Context, n names, owner, member string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(l.cfg.TTL, time.Second))
	defer cancel()
	_, _ = l.release(ctx, n, owner, member)
}

// release deletes the key if owner holds it (and removes member, if any,
// from the queue), then wakes the first waiter in the queue.
func (l *Locker) release(ctx context.Context, n names, owner, member string) (bool, error) {
	return releaseScript.Run(ctx, l.client, []string{n.lock, n.waiters}, owner, n.wake, member).Bool()
}

// grant wraps a granted lock in a lease and starts its watchdog, whose
// validity runs from sent, the time the acquire script was sent.
func (l *Locker) grant(ctx context.Context, key string, n names, owner string, token uint64, sent time.Time) (locking.Lease, error) {
	s := &lease{l: l, key: key, names: n, owner: owner, token: token}
	var onFail func(error)
	if f := l.cfg.OnRenewalFailed; f != nil {
		onFail = func(err error) { f(key, err) }
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.undo(ctx, n, owner, "")
		return nil, fmt.Errorf("acquire %q: %w", key, ErrClosed)
	}
	s.ka = locking.StartKeepalive(l.cfg.TTL, sent, s.renew, onFail)
	l.leases[s] = struct{}{}
	l.mu.Unlock()
	return s, nil
}

// Close stops the renewal of the leases still held, closing their Lost
// channels (their keys expire within the TTL), ends the waits in progress
// with ErrClosed, and closes the subscription connection.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.closing)
	leases := l.leases
	l.leases = nil
	l.mu.Unlock()
	for s := range leases {
		s.ka.Stop()
		s.ka.MarkLost()
	}
	if err := l.notifier.Close(); err != nil {
		return fmt.Errorf("close redis lock: %w", err)
	}
	return nil
}

func (l *Locker) forget(s *lease) {
	l.mu.Lock()
	delete(l.leases, s)
	l.mu.Unlock()
}

type lease struct {
	l        *Locker
	key      string
	names    names
	owner    string
	token    uint64
	ka       *locking.Keepalive
	released atomic.Bool
}

func (s *lease) Key() string           { return s.key }
func (s *lease) Token() uint64         { return s.token }
func (s *lease) Lost() <-chan struct{} { return s.ka.Lost() }

func (s *lease) renew(ctx context.Context) error {
	ok, err := renewScript.Run(ctx, s.l.client, []string{s.names.lock}, s.owner, s.l.ttl).Bool()
	switch {
	case err != nil:
		return fmt.Errorf("renew %q: %w: %w", s.key, locking.ErrUnavailable, err)
	case !ok:
		return fmt.Errorf("renew %q: %w", s.key, locking.ErrNotHeld)
	}
	return nil
}

// Release stops the watchdog, then deletes the key if this lease still owns
// it. Waiting longer than the TTL is pointless, so ctx is cut to it; a
// release that does not reach Redis leaves the key to expire.
func (s *lease) Release(ctx context.Context) error {
	if !s.released.CompareAndSwap(false, true) {
		return fmt.Errorf("release %q: %w", s.key, locking.ErrNotHeld)
	}
	s.ka.Stop()
	s.l.forget(s)
	ctx, cancel := context.WithTimeout(ctx, s.l.cfg.TTL)
	defer cancel()
	ok, err := s.l.release(ctx, s.names, s.owner, "")
	switch {
	case err != nil:
		return fmt.Errorf("release %q: %w: %w", s.key, locking.ErrUnavailable, err)
	case !ok:
		s.ka.MarkLost()
		return fmt.Errorf("release %q: %w", s.key, locking.ErrNotHeld)
	}
	return nil
}

// newOwner returns 16 random bytes in hex: owners never repeat, so an owner
// check cannot mistake another holder, or another try, for this one.
func newOwner() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand, Go 1.24)
	return hex.EncodeToString(b[:])
}
