package redislock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/locking"
)

// Queue is how a Locker takes a key, waits for it and gives it up. The
// recipe's own (the default) tries SET NX and, refused, backs off; a
// hardening package plugs another in through Config.Queue (fairqueue: a
// fair queue on the server with direct handoff; reclaim: the release a
// failover lost).
type Queue interface {
	// Join starts one Acquire of key by owner.
	Join(ctx context.Context, key, owner string) (Turn, error)
	// Release deletes key's lock if owner holds it (and may hand it on).
	// It reports whether owner held it.
	Release(ctx context.Context, key, owner string) (bool, error)
	// Close ends what the Queue keeps open (subscriptions).
	Close() error
}

// Turn is one Acquire's tries, from Join until End.
type Turn interface {
	// Try tries once to take the lock. Its errors wrap
	// locking.ErrUnavailable (or ErrClosed).
	Try(ctx context.Context) (Reply, error)
	// Wait waits after the attempt-th refused try until it is worth
	// trying again, or the lock was handed over (a Reply with a token).
	// It returns ctx.Err() when ctx ends, ErrClosed when Base.Closing does.
	Wait(ctx context.Context, attempt int, refused Reply) (Reply, error)
	// Undo removes what the turn may have left on the server: a key whose
	// reply was lost, a place in a queue. ctx is fresh and bounded.
	Undo(ctx context.Context)
	// End ends the turn; granted says a lease holds its owner now.
	End(granted bool)
}

// Reply is the outcome of a try, or of a wait that was handed the lock.
type Reply struct {
	Token  uint64        // > 0: granted, with this fencing token
	Sent   time.Time     // granted: when the granting try was sent (the validity starts there)
	PX     time.Duration // granted: the key's PX until its first renewal; 0 = the TTL
	Wait   time.Duration // refused: the holder's remaining TTL; < 0 unknown
	Holder string        // refused: the owner in the key; "" if none
}

// Base is what a Queue is built on: the Locker's client and settings, its
// id (every owner it makes is the id, a dash and 32 hex digits) and its
// closing channel, which Close closes.
type Base struct {
	Client  redis.UniversalClient
	Config  Config
	ID      string
	Closing <-chan struct{}
}

// args are every script's arguments: KEYS lock and fence, ARGV owner and
// ttl (the release and renew scripts ignore what they need not).
type args struct {
	lock, fence, owner string
	ttl                time.Duration
}

func (a args) run(ctx context.Context, c redis.Scripter, s *redis.Script) *redis.Cmd {
	return s.Run(ctx, c, []string{a.lock, a.fence}, a.owner, a.ttl.Milliseconds())
}

// retry is the recipe's Queue: a refused try waits a jittered backoff,
// capped by the holder's remaining TTL, and tries again (as bsm/redislock
// and redsync wait). Waiters are not told of a release, nor served in
// order.
type retry struct {
	Base
	scripts *scripts
}

type retryTurn struct {
	q *retry
	a args
}

func (q *retry) args(key, owner string) args {
	lock := q.Config.Prefix + "{" + key + "}"
	return args{lock: lock, fence: lock + ":fence", owner: owner, ttl: q.Config.TTL}
}

func (q *retry) Join(_ context.Context, key, owner string) (Turn, error) {
	return &retryTurn{q: q, a: q.args(key, owner)}, nil
}

func (q *retry) Release(ctx context.Context, key, owner string) (bool, error) {
	return q.args(key, owner).run(ctx, q.Client, q.scripts.release).Bool()
}

func (q *retry) Close() error { return nil }

func (t *retryTurn) Try(ctx context.Context) (Reply, error) {
	sent := time.Now()
	res, err := t.a.run(ctx, t.q.Client, t.q.scripts.acquire).Slice()
	if err != nil {
		return Reply{}, fmt.Errorf("%w: %w", locking.ErrUnavailable, err)
	}
	if len(res) < 2 {
		return Reply{}, fmt.Errorf("%w: acquire script returned %v", locking.ErrUnavailable, res)
	}
	granted, _ := res[0].(int64)
	n, _ := res[1].(int64)
	switch {
	case granted != 1:
		r := Reply{Wait: time.Duration(n) * time.Millisecond}
		if len(res) > 2 {
			r.Holder, _ = res[2].(string)
		}
		return r, nil
	case n <= 0:
		return Reply{}, fmt.Errorf("%w: fence counter %s is %d, not positive", locking.ErrUnavailable, t.a.fence, n)
	}
	return Reply{Token: uint64(n), Sent: sent}, nil
}

func (t *retryTurn) Wait(ctx context.Context, attempt int, refused Reply) (Reply, error) {
	cfg := t.q.Config
	timer := time.NewTimer(backoff(cfg.MinBackoff, cfg.MaxBackoff, attempt, refused.Wait))
	defer timer.Stop()
	select {
	case <-timer.C:
		return Reply{}, nil
	case <-ctx.Done():
		return Reply{}, ctx.Err()
	case <-t.q.Closing:
		return Reply{}, ErrClosed
	}
}

func (t *retryTurn) Undo(ctx context.Context) {
	_, _ = t.a.run(ctx, t.q.Client, t.q.scripts.release).Result()
}

func (t *retryTurn) End(bool) {}

// backoff is the wait before try number attempt+1: exponential from lo to
// hi, with jitter (waiters of several processes do not retry in step),
// and, when limit >= 0 is shorter (the holder's remaining TTL), limit plus
// a jitter below lo.
func backoff(lo, hi time.Duration, attempt int, limit time.Duration) time.Duration {
	d := hi
	if attempt < 30 {
		d = min(d, lo<<attempt)
	}
	d = d/2 + rand.N(d/2+1)
	if limit >= 0 && limit < d {
		d = limit + rand.N(lo)
	}
	return d
}
