package waitq_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/internal/waitq"
)

// After the subscription connection is killed, the Notifier subscribes
// again and then wakes its watchers: releases may have been missed.
func TestNotifierResubscribes(t *testing.T) {
	addr := testbed.Redis(t)
	noLeaks(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	n := waitq.NewNotifier(c)
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

// A Notifier whose client is closed (go-redis closes a Cluster node's
// client a minute after the node left the slot map) ends by itself: it
// wakes its watchers, reports Closed so that its users take another one,
// and leaves no goroutine or connection behind, instead of redialing on
// the closed client for as long as the process lives.
func TestNotifierEndsWithItsClient(t *testing.T) {
	addr := testbed.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: addr})
	n := waitq.NewNotifier(c)
	t.Cleanup(func() { n.Close() }) // runs after the leak check: it must not be needed
	noLeaks(t)
	wake := make(chan struct{}, 1)
	w := n.Watch("ch", wake)
	defer w.Stop()
	waitFor(t, "subscription", w.Ready())
	if err := c.Publish(t.Context(), "ch", "x").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "message", wake)

	c.Close()
	waitFor(t, "wake-up when the client closed", wake)
	deadline := time.Now().Add(10 * time.Second)
	for !n.Closed() {
		if time.Now().After(deadline) {
			t.Fatal("the Notifier goes on over a closed client")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select { // and it opens nothing again
	case <-n.Watch("other", make(chan struct{}, 1)).Ready():
	default:
		t.Fatal("a watch on the closed Notifier waits for a subscription")
	}
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
	n := waitq.NewNotifier(c)
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
