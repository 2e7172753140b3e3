//go:build !race

// Rates, not the race detector: under -race the black-holed path (a dial
// through the in-process proxy for every request that times out) costs
// several times what it costs in a normal build, and the ratio measures
// the detector. make test runs these without -race.

package redlock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/redlock"
)

// minQuorumRatio is the share of the all-healthy handoff rate a hot key
// keeps with one node of three black-holed.
const minQuorumRatio = 0.8

// Acquire and Release return on a majority's answer: with one node of three
// black-holed (requests vanish, nothing comes back), a hot key's handoffs
// per second stay within 80% of the rate with every node healthy, measured
// in the same run.
func TestQuorumKeepsHandoffRate(t *testing.T) {
	healthy, holed := handoffRates(t, 4, 8)
	t.Logf("hot-key handoffs/s: %.0f all healthy, %.0f with one node black-holed (ratio %.2f)", healthy, holed, holed/healthy)
	if holed < minQuorumRatio*healthy {
		t.Errorf("with one node of three black-holed, %.0f handoffs/s, below %.0f%% of the %.0f/s with every node healthy: Redlock waits for the minority",
			holed, 100*minQuorumRatio, healthy)
	}
}

// The check above fails a Redlock that waits for every node (each request
// then waits out the per-node timeout on the black-holed node).
func TestQuorumCheckCatchesWaitingForAll(t *testing.T) {
	redlock.WaitForAll(t)
	healthy, holed := handoffRates(t, 2, 1) // each release waits a TTL: keep it short
	t.Logf("waiting for every node: hot-key handoffs/s: %.0f all healthy, %.0f with one node black-holed (ratio %.2f)", healthy, holed, holed/healthy)
	if holed >= minQuorumRatio*healthy {
		t.Errorf("a Redlock that waits for every node kept %.0f of %.0f handoffs/s with one node black-holed: the quorum check cannot fail", holed, healthy)
	}
}

// handoffRates measures the handoffs per second of one hot key among n
// Lockers, with every node healthy and with node 0 black-holed: two groups
// of Lockers, each reaching the same three servers through its own
// proxies, take turns (so that both see the same load on the machine), for
// the given number of rounds after a warm-up.
func handoffRates(t *testing.T, n, rounds int) (healthy, holed float64) {
	addrs := testbed.Redises(t, 3)
	// A per-node timeout well above the stalls of a loaded machine: a
	// healthy node that misses it looks down.
	cfg := redlock.Config{TTL: 2 * time.Second, NodeTimeout: 300 * time.Millisecond}
	groups := make([][]*redlock.Locker, 2)
	for g := range groups {
		paths, proxies := proxied(t, addrs)
		if g == 1 {
			if err := proxies[0].Cut(); err != nil {
				t.Fatal(err)
			}
		}
		for range n {
			groups[g] = append(groups[g], proxiedLocker(t, paths, cfg))
		}
	}
	const turn = 200 * time.Millisecond
	for g, lockers := range groups { // dials and subscriptions, not counted
		hotKey(t, lockers, fmt.Sprintf("hot-%d", g), turn)
	}
	var rates [2]float64
	for range rounds {
		for g, lockers := range groups {
			rates[g] += hotKey(t, lockers, fmt.Sprintf("hot-%d", g), turn) / float64(rounds)
		}
	}
	if rates[0] == 0 {
		t.Fatal("no handoff at all with every node healthy")
	}
	return rates[0], rates[1]
}

// hotKey has each Locker acquire and release key in a loop, starting no new
// Acquire after d, and returns the handoffs per second. Nothing is cut
// short by a deadline: a request given up in flight may still set its key,
// which then blocks the key for a TTL.
func hotKey(t *testing.T, lockers []*redlock.Locker, key string, d time.Duration) float64 {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var (
		n  atomic.Int64
		wg sync.WaitGroup
	)
	start := make(chan struct{})
	began := time.Now()
	for _, l := range lockers {
		wg.Go(func() {
			<-start
			for time.Since(began) < d {
				// A node that misses the per-node timeout (a stall of the
				// loaded machine) looks down: an attempt with no majority
				// ends this worker's turn, costing its group handoffs.
				lease, err := l.Acquire(ctx, key)
				if err != nil {
					t.Logf("acquire %s: %v", key, err)
					return
				}
				if err := lease.Release(ctx); err != nil {
					t.Logf("release %s: %v", key, err)
					return
				}
				n.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	return float64(n.Load()) / time.Since(began).Seconds()
}

// An acquire attempt leaves behind only a node known to be slow: a healthy
// node a few ms farther than the others may hold the deciding vote. Node 1
// answers "no" at once for a whole TTL (another owner's stray key, as a
// Release that reached only a majority leaves), node 0 "yes" at once, and
// node 2's "yes", 6 ms away, decides: Acquire must get the lock, not cut
// node 2 off on every attempt until its ctx ends (review 3, F9).
func TestQuorumHearsAFartherNode(t *testing.T) {
	addrs := testbed.Redises(t, 3)
	paths, proxies := proxied(t, addrs)
	if err := proxies[2].Latency(3 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	l := proxiedLocker(t, paths, redlock.Config{TTL: 2 * time.Second})
	stray := redis.NewClient(&redis.Options{Addr: addrs[1]})
	t.Cleanup(func() { stray.Close() })
	for i := range 5 {
		key := fmt.Sprintf("farther-%d", i)
		if err := stray.Set(t.Context(), "lock:{"+key+"}", "stray", 5*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		start := time.Now()
		lease, err := l.Acquire(ctx, key)
		cancel()
		if err != nil {
			t.Fatalf("key %d: nodes 0 and 2 free, node 2 %v away: Acquire: %v after %v", i, 6*time.Millisecond, err, time.Since(start))
		}
		lease.Release(context.Background())
	}
}
