package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
)

// bsmRetry is the retry strategy bsm/redislock's README example uses
// (ExampleClient_Obtain_retry: LinearBackoff(100ms)), without its
// LimitRetry(3): the wait is bounded by the ctx deadline instead.
const bsmRetry = 100 * time.Millisecond

// redisClient is how every implementation on Redis gets its client: go-redis
// defaults, like ours gets from internal/redisconn; hooks (TestRoundTrips's
// counter) are added to it.
func redisClient(addr string, hooks ...redis.Hook) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr})
	for _, h := range hooks {
		c.AddHook(h)
	}
	return c
}

func BenchmarkRedis(b *testing.B) {
	addr := testbed.Redis(b)
	runServer(b, "redis", redisVersion(b, addr), []impl{
		ours("redis", backends.Config{RedisAddr: addr},
			"direct handoff: a release hands the lock to the first live waiter of a queue kept in Redis, its token in a pub/sub message (no try of its own); fallback jittered backoff from 5 ms times the waiters ahead to 1 s, capped by the holder's TTL; renews and fences"),
		bsmRedislock(addr),
		redsyncImpl([]string{addr}),
	})
}

// bsmRedislock is the peer github.com/bsm/redislock, which has no blocking
// acquisition: Obtain retries on the strategy its caller gives.
func bsmRedislock(addr string, hooks ...redis.Hook) impl {
	return impl{
		name: "bsm-redislock",
		wait: fmt.Sprintf("retries every %v (LinearBackoff, its README example) until the ctx deadline", bsmRetry),
		open: func(ctx context.Context) (*contender, error) {
			client := redisClient(addr, hooks...)
			locker := bsm.New(client)
			opts := &bsm.Options{RetryStrategy: bsm.LinearBackoff(bsmRetry)}
			return &contender{
				lock: func(ctx context.Context, key string) (unlockFunc, error) {
					l, err := locker.Obtain(ctx, key, ttl, opts)
					if err != nil {
						return nil, err
					}
					return l.Release, nil
				},
				close: client.Close,
			}, nil
		},
	}
}

func BenchmarkRedlock(b *testing.B) {
	addrs := testbed.Redises(b, 3)
	runServer(b, "redlock", redisVersion(b, addrs[0])+" x3", []impl{
		ours("redlock", backends.Config{RedlockAddrs: addrs},
			"pub/sub: a release wakes the first waiter in each node's queue (mostly the same one); fallback jittered backoff 5 ms-1 s capped by the keys' TTL; renews"),
		redsyncImpl(addrs),
	})
}

// redsyncImpl is redsync over addrs with its defaults (random 50-250 ms
// between tries, drift factor 0.01), its expiry set to the common TTL, and
// tries unlimited instead of 32: a hot key's waiter would otherwise give up
// after about 5 s, and the wait is bounded by the ctx deadline instead.
func redsyncImpl(addrs []string, hooks ...redis.Hook) impl {
	return impl{
		name: "redsync",
		wait: "sleeps a random 50-250 ms between tries (its default); WithTries unlimited instead of 32, bounded by the ctx deadline",
		open: func(ctx context.Context) (*contender, error) {
			var (
				pools   []rsredis.Pool
				clients []*redis.Client
			)
			for _, a := range addrs {
				c := redisClient(a, hooks...)
				clients = append(clients, c)
				pools = append(pools, goredis.NewPool(c))
			}
			rs := redsync.New(pools...)
			return &contender{
				lock: func(ctx context.Context, key string) (unlockFunc, error) {
					m := rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(math.MaxInt32))
					if err := m.LockContext(ctx); err != nil {
						// redsync drops ctx.Err() (ErrFailed): put it back.
						return nil, errors.Join(err, ctx.Err())
					}
					return func(ctx context.Context) error {
						ok, err := m.UnlockContext(ctx)
						if err == nil && !ok {
							err = errors.New("redsync: unlock: not held")
						}
						return err
					}, nil
				},
				close: func() error {
					var errs []error
					for _, c := range clients {
						errs = append(errs, c.Close())
					}
					return errors.Join(errs...)
				},
			}, nil
		},
	}
}

// redisVersion asks the server, so the table names what really ran.
func redisVersion(b *testing.B, addr string) string {
	b.Helper()
	c := redisClient(addr)
	defer c.Close()
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		b.Fatalf("redis %s: %v", addr, err)
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
			return "Redis " + v
		}
	}
	return "Redis (unknown version)"
}
