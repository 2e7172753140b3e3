package fairwake_test

import (
	"testing"

	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/redlock"
	"github.com/oversold-lab/oversold/locking/redlock/internal/redlocktest"
)

// proxiedLocker opens its clients and the Locker as orderd does (ctx
// deadlines bound each request; quorum and fairwake).
func proxiedLocker(tb testing.TB, addrs []string, cfg redlock.Config) *redlock.Locker {
	return redlocktest.ProxiedLocker(tb, backends.NewRedlock, addrs, cfg)
}
