// Package redislock is a lock on one Redis server (standalone, Sentinel's
// master, or a Cluster), with a fencing token, a watchdog and a Lost channel.
//
// Acquire runs one script: SET lock owner NX PX ttl, with an owner of 128
// random bits, and on success INCR of the key's fence counter, whose value
// is the lease's token: storage refuses a write whose token is not above
// the last one it saw, so a holder that paused past its TTL cannot
// overwrite its successor. Refused, it waits (a jittered backoff capped by
// the holder's remaining TTL) and tries again. A granted lease is renewed
// every TTL/3 by a script that extends the key only while it holds the
// owner (keepalive.Watchdog); Lost closes before Redis can expire the key
// if renewals stop succeeding. Release deletes the key by the same owner
// check. A wait ended by ctx deletes the key if its owner is there (the
// try's reply may have been lost after the SET), on a fresh bounded
// context. The lock key is "lock:{key}": the hash tag keeps the lock and
// its counter in one Cluster slot.
//
// This is the recipe. How a Locker waits, hands a lock over and gives up a
// key is its Queue; locking/backends plugs in the hardened one: a fair
// queue on the server whose releases hand the lock to the first waiter
// (locking/redislock/fairqueue) and the re-release of a key a failover
// kept (locking/redislock/reclaim).
//
// The failure modes (pauses, failovers, clocks, eviction), the token's
// guarantees and the sources: docs/locks/redis.md.
package redislock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/keepalive"
)

var _ locking.Locker = (*Locker)(nil)

// ErrClosed is returned by Acquire on a closed Locker.
var ErrClosed = errors.New("redislock: locker closed")

var (
	//go:embed acquire.lua
	acquireLua string
	//go:embed release.lua
	releaseLua string
	//go:embed renew.lua
	renewLua string
)

// scripts are a Locker's; its tests may break one.
type scripts struct{ acquire, release, renew *redis.Script }

// Config tunes a Locker. The zero value is usable.
type Config struct {
	// TTL is the lease time to live, renewed every TTL/3. 0 = 10s.
	TTL time.Duration
	// Prefix starts every Redis key of the Locker. "" = "lock:".
	Prefix string
	// MinBackoff and MaxBackoff bound a refused try's wait; it never waits
	// past the holder's remaining TTL. 0 = 5ms and 1s.
	MinBackoff, MaxBackoff time.Duration
	// OnRenewalFailed, if set, hears every failed renewal (for metrics).
	OnRenewalFailed func(key string, err error)
	// Queue, if set, makes the Locker's Queue in place of the recipe's
	// try-and-back-off (fairqueue.New, for one).
	Queue func(Base) Queue
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

// Locker grants leases on keys of one Redis server. It is safe for
// concurrent use.
type Locker struct {
	client  redis.UniversalClient
	cfg     Config
	id      string // starts every owner this Locker makes
	queue   Queue
	scripts *scripts

	mu      sync.Mutex
	leases  map[*lease]struct{} // live leases, ended by Close
	closed  bool
	closing chan struct{}
}

// New returns a Locker on client. Close does not close the client.
func New(client redis.UniversalClient, cfg Config) *Locker {
	cfg = cfg.withDefaults()
	l := &Locker{
		client:  client,
		cfg:     cfg,
		id:      randomHex(8),
		scripts: &scripts{redis.NewScript(acquireLua), redis.NewScript(releaseLua), redis.NewScript(renewLua)},
		leases:  make(map[*lease]struct{}),
		closing: make(chan struct{}),
	}
	b := Base{Client: client, Config: cfg, ID: l.id, Closing: l.closing}
	if cfg.Queue != nil {
		l.queue = cfg.Queue(b)
	} else {
		l.queue = &retry{Base: b, scripts: l.scripts}
	}
	return l
}

// Acquire waits until the lock on key is granted, ctx ends, or Redis fails:
// try, granted?, wait.
func (l *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	select {
	case <-l.closing:
		return nil, fmt.Errorf("acquire %q: %w", key, ErrClosed)
	default:
	}
	owner := l.id + "-" + randomHex(16)
	turn, err := l.queue.Join(ctx, key, owner)
	if err != nil {
		return nil, fmt.Errorf("acquire %q: %w", key, err)
	}
	granted := false
	defer func() { turn.End(granted) }()
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			if attempt > 0 { // the last try may have queued us, or been handed the lock
				l.undo(ctx, turn)
			}
			return nil, fmt.Errorf("acquire %q: %w", key, err)
		}
		r, err := turn.Try(ctx)
		if err != nil {
			l.undo(ctx, turn) // the SET may have happened with its reply lost
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("acquire %q: %w", key, err)
		}
		if r.Token == 0 {
			if r, err = turn.Wait(ctx, attempt, r); err != nil {
				l.undo(ctx, turn)
				return nil, fmt.Errorf("acquire %q: %w", key, err)
			}
		}
		if r.Token > 0 {
			lease, err := l.grant(ctx, key, owner, turn, r)
			granted = err == nil
			return lease, err
		}
	}
}

// checkKey refuses an empty key, or one with a brace, which would end the
// hash tag early or open another (the lock and its counter could then land
// in different slots of a Cluster).
func checkKey(key string) error {
	switch {
	case key == "":
		return errors.New(`acquire "": empty key`)
	case strings.ContainsAny(key, "{}"):
		return fmt.Errorf("acquire %q: a key may not contain { or } (they delimit the Redis Cluster hash tag)", key)
	}
	return nil
}

// randomHex returns n random bytes in hex: owners never repeat, so an owner
// check cannot mistake another holder, or another try, for this one.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand, Go 1.24)
	return hex.EncodeToString(b)
}

// undo runs turn.Undo on a fresh context bounded by the TTL (after which
// the key is gone anyway) and a second: the caller's may have ended.
func (l *Locker) undo(ctx context.Context, turn Turn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(l.cfg.TTL, time.Second))
	defer cancel()
	turn.Undo(ctx)
}

// grant wraps a granted lock in a lease and starts its watchdog, whose
// validity runs from r.Sent for the key's PX until the first renewal
// extends it to the TTL.
func (l *Locker) grant(ctx context.Context, key, owner string, turn Turn, r Reply) (locking.Lease, error) {
	lock := l.cfg.Prefix + "{" + key + "}"
	s := &lease{l: l, key: key, a: args{lock: lock, fence: lock + ":fence", owner: owner, ttl: l.cfg.TTL}, token: r.Token}
	var onFail func(error)
	if f := l.cfg.OnRenewalFailed; f != nil {
		onFail = func(err error) { f(key, err) }
	}
	px := r.PX
	if px <= 0 {
		px = l.cfg.TTL
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.undo(ctx, turn)
		return nil, fmt.Errorf("acquire %q: %w", key, ErrClosed)
	}
	s.ka = keepalive.StartFirst(l.cfg.TTL, px, r.Sent, s.renew, onFail)
	l.leases[s] = struct{}{}
	l.mu.Unlock()
	return s, nil
}

// Close stops the renewal of the leases still held, closing their Lost
// channels (their keys expire within the TTL), ends the waits in progress
// with ErrClosed, and closes the Queue.
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
	if err := l.queue.Close(); err != nil {
		return fmt.Errorf("close redis lock: %w", err)
	}
	return nil
}

type lease struct {
	l        *Locker
	key      string
	a        args
	token    uint64
	ka       *keepalive.Watchdog
	released atomic.Bool
}

func (s *lease) Key() string           { return s.key }
func (s *lease) Token() uint64         { return s.token }
func (s *lease) Lost() <-chan struct{} { return s.ka.Lost() }

func (s *lease) renew(ctx context.Context) error {
	ok, err := s.a.run(ctx, s.l.client, s.l.scripts.renew).Bool()
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
	s.l.mu.Lock()
	delete(s.l.leases, s)
	s.l.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, s.l.cfg.TTL)
	defer cancel()
	ok, err := s.l.queue.Release(ctx, s.key, s.a.owner)
	switch {
	case err != nil:
		return fmt.Errorf("release %q: %w: %w", s.key, locking.ErrUnavailable, err)
	case !ok:
		s.ka.MarkLost()
		return fmt.Errorf("release %q: %w", s.key, locking.ErrNotHeld)
	}
	return nil
}
