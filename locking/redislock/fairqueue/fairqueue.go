// Package fairqueue is a redislock.Queue that serves waiters in order and
// hands them the lock: a fair queue kept on the server, direct handoff,
// and wake-ups by pub/sub (sharded on a Redis Cluster), on the scripts and
// Notifier of locking/internal/waitq.
//
// A refused try also queues the waiter, in the same script; it keeps the
// place of its first arrival while it keeps trying. A release hands the
// lock to the first live waiter: it sets the key to that waiter's owner,
// counts the fence and tells it the token in a message on its Locker's
// channel, so the waiter holds the lock without another round trip and a
// newcomer never finds it free in between. A waiter subscribes before it
// waits, and keeps a fallback timer (a lost message costs only time). On a
// Cluster the wake-ups go by SPUBLISH to one connection per master, and a
// wait follows its slot when it moves.
//
// What it buys: no waiter is overtaken by more than a round of newcomers
// (locktest.FairHandoff), a handoff costs a release and one message, and a
// release wakes one waiter in the whole system. How, and why each step is
// safe: docs/locks/redis.md.
package fairqueue

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
	"github.com/oversold-lab/oversold/locking/redislock"
)

// queue is the fair queue of one Locker.
type queue struct {
	redislock.Base
	scripts  waitq.Scripts
	notifier *waitq.Notifier // nil on a Cluster: shards instead
	sharded  bool            // on a Cluster: wake-ups by SPUBLISH

	mu     sync.Mutex
	shards map[*redis.Client]*waitq.Notifier // per Cluster master's node client
	closed bool
}

// New is the fair queue, for redislock.Config.Queue.
func New(b redislock.Base) redislock.Queue { return newQueue(b, waitq.Default) }

func newQueue(b redislock.Base, scripts waitq.Scripts) *queue {
	q := &queue{Base: b, scripts: scripts, shards: make(map[*redis.Client]*waitq.Notifier)}
	if _, ok := b.Client.(*redis.ClusterClient); ok {
		q.sharded = true
	} else {
		q.notifier = waitq.NewNotifier(b.Client)
	}
	return q
}

// queueLife is how long a waiter keeps its place in the queue after its
// last try: more than the longest fallback wait between two tries
// (MaxBackoff, see waitq.Backoff), so a live waiter keeps it, and a dead
// one soon loses it.
func queueLife(c redislock.Config) time.Duration {
	return 2 * (c.MaxBackoff + c.MinBackoff)
}

// handoff is the PX of a key a release hands to a waiter, until the
// waiter's first renewal extends it to its TTL: no longer than the
// waiter's place in the queue would last, so that a waiter that died or
// stopped blocks the key no longer than it did as the queue's head.
func handoff(c redislock.Config) time.Duration {
	return min(c.TTL, queueLife(c))
}

// acquireArgs are waitq's acquire script's arguments as this queue runs it
// (waitq.Scripts): the place is the server's time, a grant takes the
// waiter out of the queue, and a lock that holds the owner was handed to it.
type acquireArgs struct {
	n             waitq.Names
	owner, member string
	ttl, life     time.Duration
	sharded       bool
}

func (a acquireArgs) run(ctx context.Context, c redis.Scripter, s *redis.Script) *redis.Cmd {
	return s.Run(ctx, c, []string{a.n.Lock, a.n.Queue, a.n.Alive, a.n.Fence},
		a.owner, a.ttl.Milliseconds(), a.member, a.life.Milliseconds(), "", a.n.Wake, "", flag(a.sharded, "s"), "g")
}

// releaseArgs are waitq's release script's arguments: delete the key if
// owner holds it, take member (if any) out of the queue, and hand a free
// lock to the first live waiter.
type releaseArgs struct {
	n             waitq.Names
	owner, member string
	sharded       bool
}

func (a releaseArgs) run(ctx context.Context, c redis.Scripter, s *redis.Script) *redis.Cmd {
	return s.Run(ctx, c, []string{a.n.Lock, a.n.Queue, a.n.Alive, a.n.Fence},
		a.owner, a.n.Wake, a.member, "g", flag(a.sharded, "s"))
}

func flag(on bool, f string) string {
	if on {
		return f
	}
	return ""
}

func (q *queue) release(ctx context.Context, n waitq.Names, owner, member string) (bool, error) {
	return releaseArgs{n: n, owner: owner, member: member, sharded: q.sharded}.run(ctx, q.Client, q.scripts.Release).Bool()
}

// Release deletes the key if owner holds it and, the lock free, hands it
// to the first live waiter, waking it with the token.
func (q *queue) Release(ctx context.Context, key, owner string) (bool, error) {
	return q.release(ctx, waitq.NamesOf(q.Config.Prefix, key), owner, "")
}

// Close closes every Notifier ever made (shard refuses new ones after).
func (q *queue) Close() error {
	q.mu.Lock()
	q.closed = true
	notifiers := []*waitq.Notifier{q.notifier}
	for _, nt := range q.shards {
		notifiers = append(notifiers, nt)
	}
	q.mu.Unlock()
	var errs []error
	for _, nt := range notifiers {
		if nt != nil {
			errs = append(errs, nt.Close())
		}
	}
	return errors.Join(errs...)
}

// notifierFor returns the Notifier that hears key's wake-ups: the one
// subscription connection on a single server; on a Cluster, one sharded
// connection per master, that of the master serving the lock's slot now
// (a failover moves the slot, and later waits use the new master's). It
// looks up the master (which may reload the slot map) before taking q.mu.
func (q *queue) notifierFor(ctx context.Context, n waitq.Names) (*waitq.Notifier, error) {
	if q.notifier != nil {
		return q.notifier, nil
	}
	master, err := q.Client.(*redis.ClusterClient).MasterForKey(ctx, n.Lock)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", locking.ErrUnavailable, err)
	}
	return q.shard(master)
}

// notifierAfterMove is notifierFor once the node of a wait said that it no
// longer serves the lock's slot (waitq.Watch.Moved): a slot migration, or
// a stale slot map. It reloads go-redis's slot map first (ForEachMaster
// does, before it runs), and prefers the master that the node named in its
// MOVED reply (addr, if any): a map read from a node that has not heard of
// the migration yet may still name the old one.
func (q *queue) notifierAfterMove(ctx context.Context, n waitq.Names, addr string) (*waitq.Notifier, error) {
	if q.notifier != nil {
		return q.notifier, nil
	}
	cc := q.Client.(*redis.ClusterClient)
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
		return q.shard(master)
	}
	return q.notifierFor(ctx, n)
}

// shard returns the Notifier of a master's node client, made at its first
// use or when the one before ended with its client. It is cached per
// client, not per address: go-redis closes a node's client a minute after
// the node left the slot map, and a master back at the same address later
// (a failback) gets a new client; the old Notifier ends with its client.
// On a closed queue it returns ErrClosed, under q.mu, so that Close closes
// every Notifier ever made.
func (q *queue) shard(master *redis.Client) (*waitq.Notifier, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, redislock.ErrClosed
	}
	nt := q.shards[master]
	if nt == nil || nt.Closed() {
		maps.DeleteFunc(q.shards, func(_ *redis.Client, nt *waitq.Notifier) bool { return nt.Closed() })
		nt = waitq.NewShardNotifier(master)
		q.shards[master] = nt
	}
	return nt, nil
}

// Join picks the Notifier for the key. The waiter joins a subscription
// this process has already (a hot key) before the first try, which then
// cannot miss a release; otherwise it is made at the first refusal (a free
// key never needs one).
func (q *queue) Join(ctx context.Context, key, owner string) (redislock.Turn, error) {
	n := waitq.NamesOf(q.Config.Prefix, key)
	t := &turn{q: q, n: n, owner: owner,
		member:  waitq.HandoffMember(q.ID, owner, handoff(q.Config)),
		channel: n.Wake + q.ID,
	}
	nt, err := q.notifierFor(ctx, n)
	if err != nil {
		return nil, err
	}
	t.nt = nt
	if nt.Subscribed(t.channel) {
		t.w = waitq.NewWaiter([]*waitq.Notifier{nt}, t.channel, t.member)
	}
	return t, nil
}

// handedOver reports whether a release handed this waiter the lock (direct
// handoff), its token and the PX the key was set to. A grant counts only
// if its token exceeds fence, the counter the last try saw, refused: the
// grant came after that try ran, so the key's PX started after sent, which
// makes sent a conservative start of the lease's validity (a message late
// by more than the PX, whose key may have lapsed since, fails this test).
// A grant heard px/3 or more after sent is confirmed by a try instead (it
// finds its owner in the key, extends it to the TTL and returns the
// token): the first renewal comes px/3 after the grant, too late for the
// validity left.
func (q *queue) handedOver(w *waitq.Waiter, fence uint64, sent time.Time) (token uint64, px time.Duration, ok bool) {
	select {
	case g := <-w.Grant:
		t, p, _ := strings.Cut(g, " ")
		token, err1 := strconv.ParseUint(t, 10, 64)
		ms, err2 := strconv.ParseInt(p, 10, 64)
		px = min(time.Duration(ms)*time.Millisecond, handoff(q.Config))
		return token, px, err1 == nil && err2 == nil && token > fence && time.Since(sent) < px/3
	default:
		return 0, 0, false
	}
}
