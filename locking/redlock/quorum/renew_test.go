package quorum_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/redlock"
	"github.com/oversold-lab/oversold/locking/redlock/internal/redlocktest"
)

// A renewal renews every node it can reach, not just the majority that
// answers first: the requests to slower nodes finish in the background
// (bounded by the validity), and are not cut off when renew returns. Node 2
// is 20 ms away and its client's idle connections go stale (as after a
// reset): each renewal there dials and handshakes first, so a
// request cancelled with the majority's answer is never written, and node
// 2's key would expire at the TTL while the lease lives on.
func TestRenewalReachesSlowerNode(t *testing.T) {
	addrs := testbed.Redises(t, 3)
	paths, proxies := redlocktest.Proxied(t, addrs)
	if err := proxies[2].Latency(20 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	var cs []redis.UniversalClient
	for _, a := range paths {
		o, err := redisconn.Options(a)
		if err != nil {
			t.Fatal(err)
		}
		o.ConnMaxIdleTime = 50 * time.Millisecond
		c := redis.NewUniversalClient(o)
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	// A per-node timeout far above node 2's 80 ms (two round trips) even
	// on a loaded machine: with 500 ms (TTL 3 s), node 2's acquire or its
	// first renewal ran out of time at a load of 15 under -race, 2 runs in 6
	// (i12a). A renewal cut off with the majority's answer is never
	// written there, however long the timeout.
	const ttl = 6 * time.Second
	l, err := backends.NewRedlock(cs, redlock.Config{TTL: ttl, NodeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	admins := redlocktest.Clients(t, addrs)
	lease, err := l.Acquire(t.Context(), "renewed")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	const lock = "lock:{renewed}"
	pttl := func(i int) time.Duration {
		d, err := admins[i].PTTL(t.Context(), lock).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// Node 2's acquire answered after the majority's: wait for its key.
	for granted := time.Now(); pttl(2) < 0; time.Sleep(10 * time.Millisecond) {
		if time.Since(granted) > ttl/3 {
			t.Fatal("node 2 did not get the key within TTL/3 of the grant")
		}
	}
	before, read := pttl(2), time.Now()
	// The first renewal, at TTL/3, shows on node 0 as a PTTL that goes up.
	for last := pttl(0); ; {
		time.Sleep(10 * time.Millisecond)
		now := pttl(0)
		if now > last {
			break
		}
		if time.Since(read) > ttl {
			t.Fatal("no renewal reached node 0 within the TTL")
		}
		last = now
	}
	// Node 2's renewal takes a few round trips of 40 ms (a dial, the
	// handshake, the script); give it the per-node timeout and more.
	renewed := time.Now()
	for {
		unrenewed, got := before-time.Since(read), pttl(2)
		if got >= unrenewed+ttl/6 {
			t.Logf("node 2 renewed within %v of node 0: PTTL %v, %v had it not been", time.Since(renewed).Round(time.Millisecond), got, unrenewed.Round(time.Millisecond))
			break
		}
		// Not much later: an unrenewed key on node 2 expires a TTL after
		// read, and its PTTL of -2 would then pass the check above.
		if time.Since(renewed) > ttl/2 {
			t.Fatalf("node 2's key was not renewed: PTTL %v, %v had it not been renewed (TTL %v): renewals stop at the majority's answer", got, unrenewed.Round(time.Millisecond), ttl)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-lease.Lost():
		t.Error("the lease was lost")
	default:
	}
}
