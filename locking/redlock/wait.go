package redlock

import (
	"context"
	mrand "math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

// Queue is how an Acquire waits for the lock, and what its requests do on
// a node. The default, Sleep, tries SET NX PX and sleeps a random while
// between tries; locking/redlock/fairwake queues the waiter on every node
// and wakes it with the release.
type Queue interface {
	// Join starts the wait of one Acquire on key. closing closes with the
	// Locker: Next then returns ErrClosed.
	Join(key string, cfg Config, closing <-chan struct{}) Wait
	// Close ends what the Queue keeps open (subscriptions), at Close.
	Close() error
}

// Wait is one Acquire's wait. Its requests on node i take owner, a new
// random value per attempt.
type Wait interface {
	// Try asks node i for the lock.
	Try(ctx context.Context, i int, c redis.UniversalClient, owner string) Vote
	// End deletes owner's key on node i if it is still owner's. last: the
	// wait or the lease is over (the waiter leaves, the next one may go).
	// bury: a request of owner's there ended without an answer, and may
	// still land after this one.
	End(ctx context.Context, i int, c redis.UniversalClient, owner string, last, bury bool) Vote
	// Next waits until the next try is due, after attempt got votes in
	// elapsed.
	Next(ctx context.Context, attempt int, votes []Vote, elapsed time.Duration) error
	// Queued tells whether the wait left more than its keys on the nodes
	// (a place in a queue): a wait that ends without the lock then sends
	// End(last) to every node.
	Queued() bool
	// Stop ends the wait, granted or not.
	Stop(granted bool)
}

// Sleep is the default Queue.
type Sleep struct{}

func (Sleep) Join(key string, cfg Config, closing <-chan struct{}) Wait {
	return &sleeper{lock: cfg.Prefix + "{" + key + "}", cfg: cfg, closing: closing}
}

func (Sleep) Close() error { return nil }

type sleeper struct {
	lock    string
	cfg     Config
	closing <-chan struct{}
}

var (
	// release deletes the key only while it holds the caller's owner.
	release = redis.NewScript(`if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0`)
	// renew extends the key only while it holds the caller's owner: a
	// renewal never revives an expired lease.
	renew = redis.NewScript(`if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0`)
)

func (s *sleeper) Try(ctx context.Context, _ int, c redis.UniversalClient, owner string) Vote {
	ok, err := c.SetNX(ctx, s.lock, owner, s.cfg.TTL).Result()
	return Vote{Yes: ok, PTTL: -1, Err: err}
}

func (s *sleeper) End(ctx context.Context, _ int, c redis.UniversalClient, owner string, _, _ bool) Vote {
	ok, err := release.Run(ctx, c, []string{s.lock}, owner).Bool()
	return Vote{Yes: ok, Err: err}
}

// Next sleeps a random while, growing with each attempt from MinBackoff to
// MaxBackoff, so that contenders do not meet again.
func (s *sleeper) Next(ctx context.Context, attempt int, _ []Vote, _ time.Duration) error {
	d := s.cfg.MaxBackoff
	if attempt < 30 {
		d = min(d, s.cfg.MinBackoff<<attempt)
	}
	t := time.NewTimer(d/2 + mrand.N(d/2+1))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closing:
		return ErrClosed
	}
}

func (s *sleeper) Queued() bool { return false }
func (s *sleeper) Stop(bool)    {}
