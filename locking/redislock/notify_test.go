package redislock_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// After the subscription connection is killed, the Notifier subscribes
// again and then wakes its watchers: releases may have been missed.
func TestNotifierResubscribes(t *testing.T) {
	addr := testbed.Redis(t)
	noLeaks(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	n := redislock.NewNotifier(c)
	t.Cleanup(func() { n.Close() })

	wake := make(chan struct{}, 1)
	w := n.Watch("ch", wake)
	defer w.Stop()
	waitFor(t, "subscription", w.Ready())
	admin.Publish(t.Context(), "ch", "x")
	waitFor(t, "message", wake)

	if err := admin.ClientKillByFilter(t.Context(), "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	// The wake-up comes once the new subscription is confirmed.
	waitFor(t, "wake-up after the connection broke", wake)
	admin.Publish(t.Context(), "ch", "x")
	waitFor(t, "message on the new connection", wake)
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
	l := redislock.New(c, cfg)
	t.Cleanup(func() { l.Close(); c.Close() })
	return l
}

func waitFor(t *testing.T, what string, c <-chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s in 10s", what)
	}
}

// noLeaks checks, after the test's cleanups, that it left no goroutines
// behind; call it after starting the servers.
func noLeaks(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

// The Notifier's lock guards state every Acquire needs; the connection's
// dial and writes happen outside it. With the dial hanging, a Watch, a Join
// and a Stop on other channels still return at once.
func TestNotifierDoesNotDialUnderItsLock(t *testing.T) {
	addr := testbed.Redis(t)
	hang := make(chan struct{})
	var d net.Dialer
	c := redis.NewClient(&redis.Options{Addr: addr, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		<-hang // a server that does not answer the dial, whatever the ctx
		return d.DialContext(ctx, network, addr)
	}})
	defer c.Close()
	n := redislock.NewNotifier(c)
	defer n.Close()
	defer close(hang) // before Close, which waits for the dial
	done := make(chan struct{})
	go func() {
		defer close(done)
		a := n.Watch("a", make(chan struct{}, 1)) // starts the dial
		b := n.Watch("b", make(chan struct{}, 1))
		n.Join("a", make(chan struct{}, 1))
		a.Stop()
		b.Stop()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Watch, Join and Stop blocked behind a hanging dial")
	}
}
