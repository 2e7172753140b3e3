package fairqueue_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/internal/waitq"
	"github.com/oversold-lab/oversold/locking/redislock"
)

// TestClusterPubSubFanout measures, on a Redis Cluster of three masters
// with a replica each, what one wake-up costs every node (the claim: "every
// node receives every PUBLISH"). It counts the publish messages each node
// receives over the cluster bus (CLUSTER INFO cluster_stats_messages_
// publish_received and _publishshard_received) for n PUBLISHes, n
// SPUBLISHes (Redis 7's sharded pub/sub), and n lock handoffs of this
// package's lock, whose release publishes one wake-up only when a waiter
// is queued (SPUBLISH on a Cluster, on the waiter's Locker's channel): only
// the slot's shard hears it. Run with -v for
// the table.
func TestClusterPubSubFanout(t *testing.T) {
	addrs := testbed.RedisCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const n = 50
	key := testbed.Prefix(t)
	channel := "lock:{" + key + "}:released"

	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cc.Close()
	// From the master of the channel's slot, as the lock's release script
	// publishes (a keyless PUBLISH would go to a random node).
	master, err := cc.MasterForKey(ctx, channel)
	if err != nil {
		t.Fatal(err)
	}
	measure2 := func(what, also string, do func() int) (per, perAlso map[string]float64, count int) {
		before := busCounts(t, ctx, addrs)
		count = do()
		time.Sleep(200 * time.Millisecond) // the bus delivers asynchronously
		after := busCounts(t, ctx, addrs)
		per, perAlso = map[string]float64{}, map[string]float64{}
		for _, a := range addrs {
			per[a] = float64(after[a][what]-before[a][what]) / float64(count)
			perAlso[a] = float64(after[a][also]-before[a][also]) / float64(count)
		}
		return per, perAlso, count
	}
	measure := func(what string, do func() int) (per map[string]float64, count int) {
		per, _, count = measure2(what, "", do)
		return per, count
	}
	publish, _ := measure("publish", func() int {
		for range n {
			if err := master.Publish(ctx, channel, "x").Err(); err != nil {
				t.Fatal(err)
			}
		}
		return n
	})
	spublish, _ := measure("publishshard", func() int {
		for range n {
			if err := master.SPublish(ctx, channel, "x").Err(); err != nil {
				t.Fatal(err)
			}
		}
		return n
	})
	// The lock's wake-ups: SPUBLISH from the slot's master (so its
	// "publishshard" count), and no PUBLISH at all.
	queue, queuePublish, releases := measure2("publishshard", "publish", func() int { return handoffs(t, ctx, strings.Join(addrs, ","), key, n) })

	t.Logf("bus messages received per node per publish (PUBLISH, SPUBLISH) and per lock release (the wake-up queue, SPUBLISH, %d releases):", releases)
	t.Logf("%-16s %8s %8s %8s", "node", "PUBLISH", "SPUBLISH", "queue")
	var pubNodes, spubNodes, queueNodes int
	for _, a := range addrs {
		t.Logf("%-16s %8.2f %8.2f %8.2f", a, publish[a], spublish[a], queue[a])
		if publish[a] >= 0.99 {
			pubNodes++
		}
		if spublish[a] >= 0.99 {
			spubNodes++
		}
		if queue[a] > 1.01 {
			t.Errorf("node %s got %.2f wake-ups per release: the queue publishes at most one", a, queue[a])
		}
		if queue[a] > 0 && spublish[a] < 0.99 {
			t.Errorf("node %s, outside the lock's shard, got %.2f sharded wake-ups per release", a, queue[a])
		}
		if queuePublish[a] > 0 {
			t.Errorf("node %s got %.2f PUBLISH messages per release: the lock's wake-ups must use SPUBLISH on a Cluster", a, queuePublish[a])
		}
		if queue[a] >= 0.5 {
			queueNodes++
		}
	}
	// The publishing master delivers to its own subscribers; the bus
	// carries the message to every other node: five of six.
	if pubNodes != len(addrs)-1 {
		t.Errorf("PUBLISH reached %d nodes over the bus, want %d (every node but the sender)", pubNodes, len(addrs)-1)
	}
	// SPUBLISH stays in the shard: its master's replica, one node.
	if spubNodes != 1 {
		t.Errorf("SPUBLISH reached %d nodes over the bus, want 1 (the shard's replica)", spubNodes)
	}
	// Each release with a waiter queued wakes it by one SPUBLISH, which
	// the bus carries to the shard's replica alone.
	if queueNodes != 1 {
		t.Errorf("the lock's wake-ups reached %d nodes over the bus, want 1 (the shard's replica)", queueNodes)
	}
}

// busCounts reads each node's cluster-bus message counters by type.
func busCounts(t *testing.T, ctx context.Context, addrs []string) map[string]map[string]int64 {
	t.Helper()
	out := map[string]map[string]int64{}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		info, err := c.ClusterInfo(ctx).Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int64{}
		for _, l := range strings.Split(info, "\r\n") {
			for _, what := range []string{"publish", "publishshard"} {
				if v, ok := strings.CutPrefix(l, "cluster_stats_messages_"+what+"_received:"); ok {
					m[what], _ = strconv.ParseInt(v, 10, 64)
				}
			}
		}
		out[a] = m
	}
	return out
}

// handoffs passes key's lock n times between two Lockers, each holding it
// until the other waits (queued), and returns the number of releases.
func handoffs(t *testing.T, ctx context.Context, addr, key string, n int) int {
	t.Helper()
	cfg := redislock.Config{TTL: 10 * time.Second, MinBackoff: time.Minute, MaxBackoff: time.Minute}
	lockers := []*redislock.Locker{newLocker(t, addr, cfg), newLocker(t, addr, cfg)}
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addr, ",")})
	defer admin.Close()
	queue := waitq.NamesOf("lock:", key).Queue
	var finished [2]atomic.Bool
	// queued waits, a few seconds at most, for the other Locker to queue,
	// unless it has made all its rounds: a fixed 2 ms hold let it queue
	// too late on a loaded machine, and a release with nobody queued
	// publishes nothing (0 wake-ups in 50 releases once, at load 17).
	queued := func(other int) {
		for deadline := time.Now().Add(5 * time.Second); !finished[other].Load() && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if admin.ZCard(ctx, queue).Val() > 0 {
				return
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i, l := range lockers {
		wg.Go(func() {
			defer finished[i].Store(true)
			for j := range n / 2 {
				lease, err := l.Acquire(ctx, key)
				if err != nil {
					errs <- fmt.Errorf("locker %d, round %d: %w", i, j, err)
					return
				}
				queued(1 - i)
				if err := lease.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return n / 2 * 2
}
