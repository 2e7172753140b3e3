package fairqueue_test

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/redislock"
	"github.com/oversold-lab/oversold/locking/redislock/internal/redislocktest"
)

// A waiter must be woken by the release message, not by its fallback timer:
// with the timer and the holder's TTL far away, only the message is quick.
func TestReleaseWakesWaiter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(*testing.T) string
	}{
		{"server", func(t *testing.T) string { return testbed.Redis(t) }},
		{"cluster", func(t *testing.T) string { return strings.Join(testbed.RedisCluster(t), ",") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := tc.start(t)
			noLeaks(t)
			cfg := redislock.Config{TTL: time.Minute, MinBackoff: time.Minute, MaxBackoff: time.Minute}
			locktest.ReleaseWakesWaiter(t, newLocker(t, addr, cfg), newLocker(t, addr, cfg))
		})
	}
}

// Close ends the waits in progress.
func TestCloseEndsWaits(t *testing.T) {
	addr := testbed.Redis(t)
	noLeaks(t)
	redislocktest.CloseEndsWaits(t, newLocker(t, addr, redislock.Config{}), newLocker(t, addr, redislock.Config{}))
}

func newLocker(t *testing.T, addr string, cfg redislock.Config) *redislock.Locker {
	return redislocktest.NewLocker(t, addr, hardened(cfg))
}

// noLeaks checks, after the test's cleanups, that it left no goroutines
// behind; call it after starting the servers.
func noLeaks(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}
