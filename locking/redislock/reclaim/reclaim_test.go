package reclaim_test

import (
	"testing"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/redislock"
	"github.com/oversold-lab/oversold/locking/redislock/fairqueue"
	"github.com/oversold-lab/oversold/locking/redislock/internal/redislocktest"
	"github.com/oversold-lab/oversold/locking/redislock/reclaim"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// hardened is cfg with the Queue locking/backends composes: the fair
// queue, and this package's re-release of a key a failover kept.
func hardened(cfg redislock.Config) redislock.Config {
	cfg.Queue = reclaim.Wrap(fairqueue.New)
	return cfg
}

func lockKey(key string) string { return redislocktest.LockKey(key) }

func newLocker(t *testing.T, addr string, cfg redislock.Config) *redislock.Locker {
	return redislocktest.NewLocker(t, addr, hardened(cfg))
}
