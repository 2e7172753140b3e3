package reclaim_test

import (
	"testing"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/redislock"
	"github.com/oversold-lab/oversold/locking/redislock/fairqueue"
	"github.com/oversold-lab/oversold/locking/redislock/reclaim"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// hardened is cfg with the Queue locking/backends composes: the fair
// queue, and this package's re-release of a key a failover kept.
func hardened(cfg redislock.Config) redislock.Config {
	cfg.Queue = reclaim.Wrap(fairqueue.New)
	return cfg
}

func lockKey(key string) string { return "lock:{" + key + "}" } // the default prefix

func newLocker(t *testing.T, addr string, cfg redislock.Config) *redislock.Locker {
	c, err := redisconn.Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	l := redislock.New(c, hardened(cfg))
	t.Cleanup(func() { l.Close(); c.Close() })
	return l
}
