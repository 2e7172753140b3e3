package fairqueue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/redislock"
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
			holder, waiter := newLocker(t, addr, cfg), newLocker(t, addr, cfg)
			for round := range 3 { // the later rounds find the subscription lingering
				lease, err := holder.Acquire(t.Context(), "k")
				if err != nil {
					t.Fatal(err)
				}
				got := make(chan error, 1)
				go func() {
					l, err := waiter.Acquire(t.Context(), "k")
					if err == nil {
						err = l.Release(context.Background())
					}
					got <- err
				}()
				time.Sleep(100 * time.Millisecond) // let it fail a try and subscribe
				released := time.Now()
				if err := lease.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-got:
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("round %d: woken %v after the release", round, time.Since(released).Round(time.Microsecond))
				case <-time.After(10 * time.Second):
					t.Fatalf("round %d: the waiter was not woken by the release", round)
				}
			}
		})
	}
}

// Close ends the waits in progress.
func TestCloseEndsWaits(t *testing.T) {
	addr := testbed.Redis(t)
	noLeaks(t)
	holder, waiter := newLocker(t, addr, redislock.Config{}), newLocker(t, addr, redislock.Config{})
	lease, err := holder.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(t.Context(), "k")
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	waiter.Close()
	select {
	case err := <-got:
		if !errors.Is(err, redislock.ErrClosed) {
			t.Fatalf("wait ended with %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the wait")
	}
}

func newLocker(t *testing.T, addr string, cfg redislock.Config) *redislock.Locker {
	c, err := redisconn.Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	l := redislock.New(c, hardened(cfg))
	t.Cleanup(func() { l.Close(); c.Close() })
	return l
}

// noLeaks checks, after the test's cleanups, that it left no goroutines
// behind; call it after starting the servers.
func noLeaks(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}
