package quorum_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/redlock"
	"github.com/oversold-lab/oversold/locking/redlock/fairwake"
	"github.com/oversold-lab/oversold/locking/redlock/internal/redlocktest"
)

// proxiedLocker opens its clients and the Locker as orderd does (ctx
// deadlines bound each request; quorum and fairwake). With waitAll, it
// leaves quorum out: the recipe's Fanout waits for every node, the broken
// variant the quorum tests must catch.
func proxiedLocker(tb testing.TB, addrs []string, cfg redlock.Config, waitAll bool) *redlock.Locker {
	newLocker := backends.NewRedlock
	if waitAll {
		newLocker = func(cs []redis.UniversalClient, cfg redlock.Config) (*redlock.Locker, error) {
			cfg.Queue = fairwake.New(cs)
			return redlock.New(cs, cfg)
		}
	}
	return redlocktest.ProxiedLocker(tb, newLocker, addrs, cfg)
}

func TestMain(m *testing.M) { testbed.Main(m) }
