// Package fairwake is a redlock.Queue: waiters queue fairly on every node
// and are woken by the release, instead of sleeping a random while. It uses
// the redis backend's fair queue (locking/internal/waitq) on every node.
//
// A refused try also queues the waiter there, at a place the waiter chose
// once (the time it began, the same on every node, so every node orders its
// waiters alike), and a release, on each node, wakes the first live waiter
// there by a message on its Locker's channel (one subscription connection
// per node per Locker). A waiter keeps its place until its try takes the
// lock, and a newcomer that finds the lock free where a live waiter is
// queued is refused there: the first waiter gets the freed majority even
// when a newcomer arrives during its round trip. The woken waiter tries
// once a majority of nodes has told it, or after the time of one attempt;
// without news, when its fallback timer fires (capped by the time until
// enough keys expire for a majority). After a split vote the contenders
// retry after random delays growing with each split in a row. A waiter
// that gives up leaves every queue and passes the wake-up on.
//
// Stragglers: where an acquire request ended without an answer, the
// request that ends the attempt, the wait or the lease also leaves a
// tombstone of the owner and the waiter for a TTL, and an acquire that
// arrives there later (two connections can be reordered) is refused.
// Notification and not polling, because random sleeps cap a hot key at a
// few handoffs per second. More: docs/locks/redlock.md.
package fairwake

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/locking/internal/waitq"
	"github.com/oversold-lab/oversold/locking/redlock"
)

// Queue is the Queue of one Locker: its subscriptions, one per node.
type Queue struct {
	id        string // names this Locker's waiters and wake channels
	notifiers []*waitq.Notifier
	scripts   waitq.Scripts
}

// New returns the Queue of a Locker on clients.
func New(clients []redis.UniversalClient) *Queue {
	q := &Queue{id: waitq.NewOwner()[:16], scripts: waitq.Default}
	for _, c := range clients {
		q.notifiers = append(q.notifiers, waitq.NewNotifier(c))
	}
	return q
}

// Close closes the subscription connections.
func (q *Queue) Close() error {
	var errs []error
	for _, n := range q.notifiers {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}

// Join starts one Acquire's wait: its place in the queues (the time it
// began, the same on every node, so that the nodes order their waiters
// alike) and its interest in the wake-ups.
func (q *Queue) Join(key string, cfg redlock.Config, closing <-chan struct{}) redlock.Wait {
	n := waitq.NamesOf(cfg.Prefix, key)
	member := waitq.Member(q.id, waitq.NewOwner())
	return &wait{q: q, cfg: cfg, closing: closing, names: n, member: member,
		quorum: len(q.notifiers)/2 + 1,
		place:  strconv.FormatInt(time.Now().UnixMicro(), 10),
		ttl:    strconv.FormatInt(cfg.TTL.Milliseconds(), 10),
		// More than the longest wait between two tries (a split delay,
		// then a fallback wait): a live waiter's entry does not expire.
		life:   strconv.FormatInt((3 * (cfg.MaxBackoff + cfg.MinBackoff)).Milliseconds(), 10),
		Waiter: waitq.NewWaiter(q.notifiers, n.Wake+q.id, member),
		timer:  time.NewTimer(time.Hour)}
}

// wait is what one Acquire keeps between its tries.
type wait struct {
	*waitq.Waiter
	q       *Queue
	cfg     redlock.Config
	closing <-chan struct{}
	names   waitq.Names
	member  string // our place in the queues, kept until Release
	quorum  int
	place   string
	ttl     string
	life    string
	timer   *time.Timer
	queued  atomic.Bool // a try was sent: the waiter may be in some queues
	splits  int         // split votes in a row
}

// Try runs the acquire script: grant, or queue the waiter. A node that
// grants keeps the place too ("keep"): a grant there is not yet a
// majority, and the waiter must stay first there if the attempt fails. 't':
// refused where this owner or member was buried (the request came after
// its undo or leave).
func (w *wait) Try(ctx context.Context, _ int, c redis.UniversalClient, owner string) redlock.Vote {
	w.queued.Store(true)
	n := w.names
	args := acquireArgs{owner: owner, ttl: w.ttl, member: w.member, life: w.life, place: w.place, wake: n.Wake}
	return acquireVote(w.q.scripts.Acquire.Run(ctx, c, []string{n.Lock, n.Queue, n.Alive}, args.argv()...).Slice())
}

// End deletes owner's key where it is still owner's; if last, takes the
// waiter out of the queue and wakes the next waiter where the lock is
// free (the wake-up of the last release may have come to us). bury leaves
// a tombstone of owner and member for a TTL, which makes the acquire
// script refuse them: a request of theirs that had no answer may land
// after this one.
func (w *wait) End(ctx context.Context, _ int, c redis.UniversalClient, owner string, last, bury bool) redlock.Vote {
	n := w.names
	args := releaseArgs{owner: owner, wake: n.Wake, bury: bury, ttl: w.ttl}
	if last {
		args.member, args.wakeNext = w.member, true
	}
	ok, err := w.q.scripts.Release.Run(ctx, c, []string{n.Lock, n.Queue, n.Alive}, args.argv()...).Bool()
	return redlock.Vote{Yes: ok, Err: err}
}

// acquireArgs are the acquire script's arguments (waitq.Scripts): the
// place chosen by the waiter, kept when granted ('keep': the release takes
// it out), and 't': refused where a release buried the owner or member.
type acquireArgs struct{ owner, ttl, member, life, place, wake string }

func (a acquireArgs) argv() []any {
	return []any{a.owner, a.ttl, a.member, a.life, a.place, a.wake, "keep", "", "", "t"}
}

// releaseArgs are the release script's arguments (waitq.Scripts): member
// leaves the queue (” for none), wakeNext wakes the first waiter where the
// lock is free, bury leaves tombstones of owner and member for ttl.
type releaseArgs struct {
	owner, wake, member, ttl string
	wakeNext, bury           bool
}

func (a releaseArgs) argv() []any {
	wake := "0"
	if a.wakeNext {
		wake = "1"
	}
	if !a.bury {
		return []any{a.owner, a.wake, a.member, wake}
	}
	return []any{a.owner, a.wake, a.member, wake, "", a.ttl, "t"}
}

func (w *wait) Queued() bool { return w.queued.Load() }

// Stop ends the watches; a grant uses up the wake-ups pending.
func (w *wait) Stop(granted bool) {
	if granted {
		w.Drain()
	}
	w.Waiter.Stop()
	w.timer.Stop()
}

// acquireVote reads the acquire script's answer: {1, 0}, or {0, ms to wait
// at most, the holder's owner or ” (free, but another waiter is first)}.
func acquireVote(res []any, err error) redlock.Vote {
	if err != nil {
		return redlock.Vote{Err: err}
	}
	if len(res) == 2 && res[0] == int64(1) {
		return redlock.Vote{Yes: true}
	}
	if len(res) == 3 {
		pttl, ok1 := res[1].(int64)
		holder, ok2 := res[2].(string)
		if ok1 && ok2 {
			return redlock.Vote{Holder: holder, PTTL: time.Duration(pttl) * time.Millisecond}
		}
	}
	return redlock.Vote{Err: fmt.Errorf("acquire script returned %v", res)}
}
