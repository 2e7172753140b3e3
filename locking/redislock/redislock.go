// Package redislock is a lock on one Redis server (a standalone server, a
// Sentinel-managed master, or a Cluster), with a fencing token, a watchdog
// and waiters woken by pub/sub.
//
// # How it works
//
// A key k lives at "lock:{k}" (the prefix is configurable). Acquire runs one
// Lua script: SET lock owner NX PX ttl, with an owner made of the Locker's
// id and 128 random bits, and on
// success INCR of the counter "lock:{k}:fence", whose value is the lease's
// fencing token. The hash tag {k} keeps the lock, its counter and its
// channel in one Cluster slot. A granted lease is renewed every TTL/3 by a
// script that extends the key only while it still holds the lease's owner
// (keepalive.Watchdog), and Release deletes the key by the same owner check,
// waking the first waiter (below) in the same script.
//
// A try that fails also queues the waiter, in the same script, in a fair
// queue kept on the server (locking/internal/waitq): each waiter keeps the
// place of its first arrival, scored by the server's clock, for as long as
// it keeps trying. Release, in its script, hands the lock to the first live
// waiter (direct handoff): it sets the key to that waiter's owner, counts
// the fence, takes the waiter out of the queue and tells it the token in a
// message naming it on its Locker's channel "lock:{k}:wake:<locker id>".
// The waiter holds the lock when the message arrives, without another
// round trip, so a handoff costs the release and one message, where a
// lock whose waiters retry costs a release and a try; and a newcomer never
// finds the lock free between the two, so queued waiters are served in
// order. The handed key's PX is the waiter's own choice, which its queue
// member carries and the message repeats (Config.handoff: its place's life
// in the queue, or its TTL if shorter), never the releaser's TTL: Lockers
// with different TTLs may share a server. The lease's validity runs for
// that PX from the send time of the waiter's last try, which the fence
// counter it returned shows to precede the grant (see handedOver), and its
// first renewal, a third of that PX later, extends the key to the TTL; a
// message heard a third of the PX or more after that try is confirmed by a
// try instead. A message that is lost costs nothing but time: the waiter's
// next try (within MaxBackoff) finds its own owner in the key and takes
// the lock with its token. A waiter that gives up after it was handed the
// lock releases it (and hands it on) in the script that takes it out of
// the queue; one that died or stopped after its last try (it is live for
// Config.queueLife after it) keeps the key until that PX lapses: for at
// most its place's life (2 s by default), not for a whole TTL.
// A release tells exactly one waiter in the whole system, not one per
// process: on a hot key with 32 processes the other 30 no longer run a try
// that can only fail. (Redisson's FairLock is fair the same way, but wakes
// its first waiter to try.)
//
// A waiter subscribes to its Locker's channel before it waits, and waits
// until the server has confirmed the subscription and tries again: a release
// in between is then either seen by that try or heard as a message, never
// lost. (On a hot key the channel is subscribed already, and a waiter joins
// it before its first try, which saves the second.) All waiters of a Locker
// share one subscription connection (Notifier), which wakes the waiter the
// message names. On a Cluster the wake-up is an SPUBLISH (sharded pub/sub,
// Redis 7), which stays within the shard of the lock's slot (its master
// and replicas) instead of going to every node over the cluster bus, and
// the Locker keeps one SSUBSCRIBE connection per master it has locked keys
// on (TestClusterPubSubFanout counts the bus messages per node); a wait
// whose master stops serving the slot (a migration: the master pushes
// sunsubscribe; a stale slot map: SSUBSCRIBE is answered MOVED) moves to
// the master that serves it now. A waiter also keeps a fallback timer, a jittered
// exponential backoff (Config.MinBackoff to MaxBackoff) capped by the
// holder's remaining TTL (or the first waiter's liveness, when the lock is
// free), which the failed try returned: a holder that died is replaced as
// soon as its key expires, with no message at all (Redisson waits the same
// way), and a lost handoff message costs the lock the time until the
// waiter's timer fires. A waiter that gives up (ctx, Close) leaves the
// queue and, if the lock is free (or was handed to it), hands it to the
// next waiter, in one script.
//
// A waiter of an older version, whose member states no PX, is woken, not
// handed the lock. A replica of the version before (3ac8054), releasing to
// a waiter of this one, sets the key to a value nobody owns for its own
// TTL: during a rolling upgrade from it a hot key may stall for a TTL now
// and then (never two holders: the waiter takes only a grant that states
// its PX).
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
//   - A failover can lose a release too: a lease granted before the replica
//     stopped receiving writes and released after leaves its key on the
//     promoted replica, held by nobody, for the rest of its PX (up to a
//     TTL). A waiter of the Locker that released it knows the owner has
//     ended (its id starts the owner; no lease and no Acquire of the Locker
//     holds it) and releases the key again, handing the lock on. A key left
//     by another Locker's lost release, if that Locker never waits on the
//     key, lapses with its PX, as that of a holder that died.
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
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/internal/waitq"
	"github.com/oversold-lab/oversold/locking/keepalive"
)

var _ locking.Locker = (*Locker)(nil)

// ErrClosed is returned by Acquire on a closed Locker.
var ErrClosed = errors.New("redislock: locker closed")

// scripts are the queue's scripts (waitq.Default); tests may break one.
var scripts = waitq.Default

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

// queueLife is how long a waiter keeps its place in the queue after its
// last try: more than the longest fallback wait between two tries
// (MaxBackoff, see waitq.Backoff), so a live waiter keeps it, and a dead
// one soon loses it.
func (c Config) queueLife() time.Duration {
	return 2 * (c.MaxBackoff + c.MinBackoff)
}

// handoff is the PX of a key a release hands to a waiter (direct handoff),
// until the waiter's first renewal extends it to its TTL: no longer than
// the waiter's place in the queue would last, so that a waiter that died
// or stopped blocks the key no longer than it did as the queue's head.
// A live waiter whose wake-up was lost tries again within MaxBackoff, and
// finds the key its own.
func (c Config) handoff() time.Duration {
	return min(c.TTL, c.queueLife())
}

// Locker grants leases on keys of one Redis server. It is safe for
// concurrent use.
type Locker struct {
	client   redis.UniversalClient
	cfg      Config
	id       string          // names this Locker's waiters and wake channels
	ttl      string          // cfg.TTL in milliseconds, as the scripts take it
	life     string          // queueLife in milliseconds
	notifier *waitq.Notifier // nil on a Cluster: shards instead
	sharded  string          // "s" on a Cluster: wake-ups by SPUBLISH

	mu      sync.Mutex
	shards  map[*redis.Client]*waitq.Notifier // per Cluster master's node client
	leases  map[*lease]struct{}               // live leases, ended by Close
	owners  map[string]struct{}               // owners that may be held: see abandoned
	closed  bool
	closing chan struct{}
}

// New returns a Locker on client. Close does not close the client.
func New(client redis.UniversalClient, cfg Config) *Locker {
	cfg = cfg.withDefaults()
	l := &Locker{
		client:  client,
		cfg:     cfg,
		id:      waitq.NewOwner()[:16],
		ttl:     strconv.FormatInt(cfg.TTL.Milliseconds(), 10),
		life:    strconv.FormatInt(cfg.queueLife().Milliseconds(), 10),
		shards:  make(map[*redis.Client]*waitq.Notifier),
		leases:  make(map[*lease]struct{}),
		owners:  make(map[string]struct{}),
		closing: make(chan struct{}),
	}
	if _, ok := client.(*redis.ClusterClient); ok {
		l.sharded = "s"
	} else {
		l.notifier = waitq.NewNotifier(client)
	}
	return l
}

// notifierFor returns the Notifier that hears key's wake-ups: the one
// subscription connection on a single server; on a Cluster, one sharded
// connection per master, that of the master serving the lock's slot now
// (a failover moves the slot, and later waits use the new master's). It
// looks up the master (which may reload the slot map) before taking l.mu.
//
// A shard's Notifier lives on go-redis's client of that node, and is
// cached per client, not per address: go-redis closes a node's client a
// minute after the node left the slot map, and a master back at the same
// address later (a failback) gets a new client. The Notifier of a closed
// client ends by itself (waitq.Notifier.Closed); the next wait takes a new
// one. On a closed Locker it returns ErrClosed, under l.mu, so that Close
// closes every Notifier ever made.
func (l *Locker) notifierFor(ctx context.Context, n waitq.Names) (*waitq.Notifier, error) {
	if l.notifier != nil {
		return l.notifier, nil
	}
	master, err := l.client.(*redis.ClusterClient).MasterForKey(ctx, n.Lock)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", locking.ErrUnavailable, err)
	}
	return l.shard(master)
}

// notifierAfterMove is notifierFor once the node of a wait said that it no
// longer serves the lock's slot (waitq.Watch.Moved): a slot migration, or
// a stale slot map. It reloads go-redis's slot map first (ForEachMaster
// does, before it runs), and prefers the master that the node named in its
// MOVED reply (addr, if any): a map read from a node that has not heard of
// the migration yet may still name the old one.
func (l *Locker) notifierAfterMove(ctx context.Context, n waitq.Names, addr string) (*waitq.Notifier, error) {
	if l.notifier != nil {
		return l.notifier, nil
	}
	cc := l.client.(*redis.ClusterClient)
	var named atomic.Pointer[redis.Client]
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		if addr != "" && c.Options().Addr == addr {
			named.Store(c)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", locking.ErrUnavailable, err)
	}
	if master := named.Load(); master != nil {
		return l.shard(master)
	}
	return l.notifierFor(ctx, n)
}

// shard returns the Notifier of a master's node client, made at its first
// use or when the one before ended with its client.
func (l *Locker) shard(master *redis.Client) (*waitq.Notifier, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	nt := l.shards[master]
	if nt == nil || nt.Closed() {
		maps.DeleteFunc(l.shards, func(_ *redis.Client, nt *waitq.Notifier) bool { return nt.Closed() })
		nt = waitq.NewShardNotifier(master)
		l.shards[master] = nt
	}
	return nt, nil
}

// Acquire waits until the lock on key is granted, ctx ends, or Redis fails.
// Each round tries once and, refused, waits for a wake-up or the fallback
// timer; the other steps keep the wake-ups reaching this waiter.
func (l *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if err := waitq.CheckKey(key); err != nil {
		return nil, err
	}
	select {
	case <-l.closing:
		return nil, fmt.Errorf("acquire %q: %w", key, ErrClosed)
	default:
	}
	a := l.newAcquisition(key)
	defer a.end()
	if err := a.listenIfHot(ctx); err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			if attempt > 0 { // queued by the last try, or handed the lock
				a.undo(ctx)
			}
			return nil, fmt.Errorf("acquire %q: %w", key, err)
		}
		if err := a.relisten(ctx); err != nil {
			return nil, err
		}
		sent := time.Now()
		token, wait, fence, ahead, holder, err := l.try(ctx, a.n, a.owner, a.member)
		if err != nil {
			return nil, a.failed(ctx, err)
		}
		if token > 0 {
			if a.w != nil {
				a.w.Drain() // this grant used up the release we were told of
			}
			return a.grant(ctx, token, sent, l.cfg.TTL)
		}
		if a.releaseAbandoned(ctx, holder) {
			continue
		}
		if lease, done, err := a.wait(ctx, attempt, wait, ahead, fence, sent); done {
			return lease, err
		}
	}
}

// acquisition is one Acquire's state across its tries.
type acquisition struct {
	l       *Locker
	key     string
	n       waitq.Names
	owner   string
	member  string // our place in the queue
	channel string
	nt      *waitq.Notifier
	w       *waitq.Waiter
	timer   *time.Timer
	granted bool
	repick  bool   // the last wait ended with no wake-up
	moved   bool   // the last wait's node no longer serves the slot
	movedTo string // where the MOVED said it went, if it named a node
	suspect string // an ended owner of this Locker the last try found in the key
}

func (l *Locker) newAcquisition(key string) *acquisition {
	n := waitq.NamesOf(l.cfg.Prefix, key)
	owner := l.newOwner()
	return &acquisition{
		l: l, key: key, n: n, owner: owner,
		member:  waitq.HandoffMember(l.id, owner, l.cfg.handoff()),
		channel: n.Wake + l.id,
	}
}

// end stops the waiter and the timer and, unless the lock was granted,
// forgets the owner (after the undo, if any: the owner is in no key now).
func (a *acquisition) end() {
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.w != nil {
		a.w.Stop()
	}
	if !a.granted {
		a.l.ended(a.owner)
	}
}

func (a *acquisition) grant(ctx context.Context, token uint64, sent time.Time, px time.Duration) (locking.Lease, error) {
	s, err := a.l.grant(ctx, a.key, a.n, a.owner, token, sent, px)
	a.granted = err == nil
	return s, err
}

func (a *acquisition) undo(ctx context.Context) { a.l.undo(ctx, a.n, a.owner, a.member) }

// listenIfHot picks the Notifier for the key. The waiter joins a
// subscription this process has already (a hot key) before the first try,
// which then cannot miss a release; otherwise it is made at the first
// refusal (a free key never needs one).
func (a *acquisition) listenIfHot(ctx context.Context) error {
	nt, err := a.l.notifierFor(ctx, a.n)
	if err != nil {
		return fmt.Errorf("acquire %q: %w", a.key, err)
	}
	a.nt = nt
	if nt.Subscribed(a.channel) {
		a.w = waitq.NewWaiter([]*waitq.Notifier{nt}, a.channel, a.member)
	}
	return nil
}

// relisten follows the wake-ups when the last wait says they may be
// published elsewhere now: on a Cluster the slot may have moved to another
// master, or the Notifier ended with its node client. It runs before the
// try, so the try's refusal is heard where the release will be published.
func (a *acquisition) relisten(ctx context.Context) error {
	if !a.repick && !a.moved && !a.nt.Closed() {
		return nil
	}
	var next *waitq.Notifier
	var err error
	if a.moved {
		next, err = a.l.notifierAfterMove(ctx, a.n, a.movedTo)
	} else {
		next, err = a.l.notifierFor(ctx, a.n)
	}
	if err != nil {
		a.undo(ctx)
		return fmt.Errorf("acquire %q: %w", a.key, err)
	}
	// A watch that moved has ended: watch again, on the same
	// node too (after a sunsubscribe push, which names no node,
	// it answers the new SSUBSCRIBE with the one that serves the
	// slot, unless it serves it again). But when the node named
	// by a MOVED is not a master in the slot map, which still
	// names this one, the fallback timer paces the next attempt.
	again := false
	if a.w != nil {
		again, _ = a.w.Moved()
	}
	if next != a.nt || again && !(a.moved && a.movedTo != "") {
		if a.w != nil {
			a.w.Stop()
		}
		a.nt = next
		a.w = waitq.NewWaiter([]*waitq.Notifier{a.nt}, a.channel, a.member)
	}
	a.repick, a.moved = false, false
	return nil
}

// failed handles a try that got no answer.
func (a *acquisition) failed(ctx context.Context, err error) error {
	// The SET may have happened with its reply lost: remove it.
	a.undo(ctx)
	if ctx.Err() != nil {
		return fmt.Errorf("acquire %q: %w", a.key, ctx.Err())
	}
	return fmt.Errorf("acquire %q: %w: %w", a.key, locking.ErrUnavailable, err)
}

// releaseAbandoned reports whether to try again at once because the key is
// held by a lease of this Locker that has ended.
func (a *acquisition) releaseAbandoned(ctx context.Context, holder string) bool {
	if !a.l.abandoned(holder) {
		return false
	}
	// The try may have run just before the lease's release did: try again
	// at once. If the key still holds it, its release was lost (a
	// failover to a replica that had not received it keeps the key
	// for the rest of its PX, up to a TTL), or failed. Nobody
	// holds that owner or ever will: release it again, which hands
	// the lock on, and try again.
	if holder != a.suspect {
		a.suspect = holder
		return true
	}
	a.suspect = ""
	ok, err := a.l.release(ctx, a.n, holder, "")
	return err == nil && ok
}

// wait waits, after a refusal, for a wake-up, the fallback timer, ctx or
// Close. done says Acquire returns lease and err; otherwise it tries again.
func (a *acquisition) wait(ctx context.Context, attempt int, wait time.Duration, ahead int64, fence uint64, sent time.Time) (lease locking.Lease, done bool, err error) {
	woken := (<-chan struct{})(nil)
	switch {
	case a.w == nil:
		// Made after the try: a release since may be unheard, so the
		// next try comes once the subscription is confirmed (at once if
		// the waiter joined one).
		a.w = waitq.NewWaiter([]*waitq.Notifier{a.nt}, a.channel, a.member)
		woken = a.w.Subscribe()[0]
	case a.w.Listening() == 0:
		// Subscribe, and try again once the server confirms: a release
		// between the first try and the subscription is not lost.
		woken = a.w.Subscribe()[0]
	default:
		woken = a.w.Wake
	}
	// Each waiter ahead is a handoff before this one's turn: the
	// fallback (for a lost message) need not come sooner.
	d := waitq.Backoff(a.l.cfg.MinBackoff*time.Duration(1+min(ahead, 31)), a.l.cfg.MaxBackoff, attempt, wait)
	if a.timer == nil {
		a.timer = time.NewTimer(d)
	} else {
		a.timer.Reset(d)
	}
	select {
	case <-woken:
		if token, px, ok := a.l.handedOver(a.w, fence, sent); ok {
			a.w.Drain()
			lease, err := a.grant(ctx, token, sent, px)
			return lease, true, err
		}
		a.moved, a.movedTo = a.w.Moved()
	case <-a.timer.C:
		a.repick = true
	case <-ctx.Done():
		a.undo(ctx)
		return nil, true, fmt.Errorf("acquire %q: %w", a.key, ctx.Err())
	case <-a.l.closing:
		a.undo(ctx)
		return nil, true, fmt.Errorf("acquire %q: %w", a.key, ErrClosed)
	}
	return nil, false, nil
}

// try runs the acquire script once. It returns the token if the lock was
// granted (or had been handed to owner), or else how long to wait at most
// before the next try: the holder's remaining TTL, or the first waiter's
// liveness (negative if unknown), the fence counter's value when the
// script ran, which a lock handed over later exceeds, how many waiters
// are queued ahead, and the holder's owner ("" if the lock is free).
func (l *Locker) try(ctx context.Context, n waitq.Names, owner, member string) (token uint64, wait time.Duration, fence uint64, ahead int64, holder string, err error) {
	res, err := scripts.Acquire.Run(ctx, l.client, []string{n.Lock, n.Queue, n.Alive, n.Fence}, owner, l.ttl, member, l.life, "", n.Wake, "", l.sharded, "g").Slice()
	if err != nil {
		return 0, 0, 0, 0, "", err
	}
	granted, count, ok := reply(res)
	switch {
	case !ok:
		return 0, 0, 0, 0, "", fmt.Errorf("acquire script returned %v", res)
	case !granted:
		if len(res) > 4 {
			f, _ := res[3].(int64)
			ahead, _ = res[4].(int64)
			fence = uint64(max(f, 0))
		}
		if len(res) > 2 {
			holder, _ = res[2].(string)
		}
		return 0, time.Duration(count) * time.Millisecond, fence, max(ahead, 0), holder, nil
	case count <= 0:
		return 0, 0, 0, 0, "", fmt.Errorf("fence counter %s is %d, not positive", n.Fence, count)
	}
	return uint64(count), 0, 0, 0, "", nil
}

// newOwner returns a new owner value of this Locker: its id, then 128
// random bits (an owner check cannot mistake another holder, or another
// try, for this one). It counts as held (abandoned is false) until ended.
func (l *Locker) newOwner() string {
	owner := l.id + "-" + waitq.NewOwner()
	l.mu.Lock()
	l.owners[owner] = struct{}{}
	l.mu.Unlock()
	return owner
}

// ended says that owner is in no key any more, or ought not to be: its
// Acquire failed after its undo, or its lease's release was sent.
func (l *Locker) ended(owner string) {
	l.mu.Lock()
	delete(l.owners, owner)
	l.mu.Unlock()
}

// abandoned tells whether holder, the owner in a lock key, is one of this
// Locker that has ended: no lease holds it, and no Acquire can grant it
// any more (a lock handed to a waiter that has not heard it yet is still
// its Acquire's). Its key is left over from a release that was lost (or a
// failed undo), and may be released by anyone.
func (l *Locker) abandoned(holder string) bool {
	if !strings.HasPrefix(holder, l.id+"-") {
		return false // another Locker's, or none
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, held := l.owners[holder]
	return !held
}

// handedOver reports whether a release handed this waiter the lock (direct
// handoff, release.lua's 'g'), its token and the PX the key was set to
// (Config.handoff), so that it holds the lock without another round trip.
// A grant counts only if its token exceeds fence, the counter the last try
// saw, refused: the grant came after that try ran, so the key's PX started
// after sent, which makes sent a conservative start of the lease's
// validity (a message late by more than the PX, whose key may have lapsed
// since, fails this test). A grant heard px/3 or more after sent is
// confirmed by a try instead (it finds its owner in the key, extends it to
// the TTL and returns the token): the first renewal comes px/3 after the
// grant, too late for the validity left.
func (l *Locker) handedOver(w *waitq.Waiter, fence uint64, sent time.Time) (token uint64, px time.Duration, ok bool) {
	select {
	case g := <-w.Grant:
		t, p, _ := strings.Cut(g, " ")
		token, err1 := strconv.ParseUint(t, 10, 64)
		ms, err2 := strconv.ParseInt(p, 10, 64)
		px = min(time.Duration(ms)*time.Millisecond, l.cfg.handoff())
		return token, px, err1 == nil && err2 == nil && token > fence && time.Since(sent) < px/3
	default:
		return 0, 0, false
	}
}

// reply reads the acquire script's {granted, token or ms, ...}.
func reply(res []any) (granted bool, n int64, ok bool) {
	if len(res) < 2 {
		return false, 0, false
	}
	g, ok1 := res[0].(int64)
	n, ok2 := res[1].(int64)
	return g == 1, n, ok1 && ok2
}

// undo ends a wait: it deletes the key if owner holds it (a try's reply may
// have been lost after the SET) and removes member from the queue, passing
// on the wake-up if the lock is free, with a fresh context bounded by the
// TTL (after which the key is gone anyway) and a second. If it fails, the
// key expires, and so does the waiter's place (Config.queueLife).
func (l *Locker) undo(ctx context.Context, n waitq.Names, owner, member string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(l.cfg.TTL, time.Second))
	defer cancel()
	_, _ = l.release(ctx, n, owner, member)
}

// release deletes the key if owner holds it (and removes member, if any,
// from the queue), then, if the lock is free, hands it to the first live
// waiter in the queue, waking it with the token.
func (l *Locker) release(ctx context.Context, n waitq.Names, owner, member string) (bool, error) {
	return scripts.Release.Run(ctx, l.client, []string{n.Lock, n.Queue, n.Alive, n.Fence}, owner, n.Wake, member, "g", l.sharded).Bool()
}

// grant wraps a granted lock in a lease and starts its watchdog, whose
// validity runs from sent, the time the acquire script was sent, for px,
// the key's PX (the TTL, or Config.handoff for a lock handed over) until
// the first renewal extends it to the TTL.
func (l *Locker) grant(ctx context.Context, key string, n waitq.Names, owner string, token uint64, sent time.Time, px time.Duration) (locking.Lease, error) {
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
	s.ka = keepalive.StartFirst(l.cfg.TTL, px, sent, s.renew, onFail)
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
	l.mu.Lock()
	notifiers := []*waitq.Notifier{l.notifier}
	for _, nt := range l.shards {
		notifiers = append(notifiers, nt)
	}
	l.mu.Unlock()
	var errs []error
	for _, nt := range notifiers {
		if nt != nil {
			errs = append(errs, nt.Close())
		}
	}
	if err := errors.Join(errs...); err != nil {
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
	names    waitq.Names
	owner    string
	token    uint64
	ka       *keepalive.Watchdog
	released atomic.Bool
}

func (s *lease) Key() string           { return s.key }
func (s *lease) Token() uint64         { return s.token }
func (s *lease) Lost() <-chan struct{} { return s.ka.Lost() }

func (s *lease) renew(ctx context.Context) error {
	ok, err := scripts.Renew.Run(ctx, s.l.client, []string{s.names.Lock}, s.owner, s.l.ttl).Bool()
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
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > s.l.cfg.TTL {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.l.cfg.TTL)
		defer cancel()
	}
	ok, err := s.l.release(ctx, s.names, s.owner, "")
	s.l.ended(s.owner) // only now: a waiter must not release it under us
	switch {
	case err != nil:
		return fmt.Errorf("release %q: %w: %w", s.key, locking.ErrUnavailable, err)
	case !ok:
		s.ka.MarkLost()
		return fmt.Errorf("release %q: %w", s.key, locking.ErrNotHeld)
	}
	return nil
}
