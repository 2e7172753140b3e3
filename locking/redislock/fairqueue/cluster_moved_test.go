package fairqueue_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/redislock"
)

// A wait whose slot map is stale (the slot migrated since the client last
// loaded it) subscribes on the old master, which answers MOVED naming the
// new one: the waiter subscribes there at once and is woken by the
// release. The fallback timers are 10 minutes: MOVED used to restart the
// subscription connection on the old master, in a loop, until the
// fallback. In "frozen", every reload of the waiter's slot map returns the
// map as it was before the migration (a hook on CLUSTER SLOTS): only the
// master the MOVED names leads the wait to the new one.
func TestClusterMovedReplyMovesWait(t *testing.T) {
	addrs := testbed.RedisCluster(t)
	for _, frozen := range []bool{false, true} {
		t.Run(map[bool]string{false: "stale", true: "frozen"}[frozen], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			key := testbed.Prefix(t)
			slot, from, to := lockSlot(t, ctx, addrs, key)
			addr := strings.Join(addrs, ",")
			holder := newLocker(t, addr, slowFallback)
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
			if frozen {
				before, err := from.Client.ClusterSlots(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				c.OnNewNode(func(n *redis.Client) { n.AddHook(slotsHook(before)) })
			}
			waiter := redislock.New(c, hardened(slowFallback))
			t.Cleanup(func() { waiter.Close(); c.Close() })
			stale := func() bool { // the waiter's slot map names the old master
				t.Helper()
				m, err := c.MasterForKey(ctx, "lock:{"+key+"}")
				if err != nil {
					t.Fatal(err)
				}
				return m.Options().Addr == from.Addr
			}
			if !stale() { // loads the slot map
				t.Fatal("the slot map does not name the slot's master")
			}
			lease, err := holder.Acquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			migrateSlot(t, ctx, slot, from, to)
			t.Cleanup(func() { migrateSlot(t, context.Background(), slot, to, from) })
			if !stale() {
				t.Fatal("the waiter's slot map followed the migration: no MOVED to test")
			}

			start := time.Now()
			got := acquireLater(t, ctx, waiter, key)
			waitShardChannels(t, ctx, to.Client, "lock:{"+key+"}:wake:*", 1, "the waiter's subscription on the slot's new master")
			t.Logf("subscribed on the new master %v after the wait began", time.Since(start).Round(time.Microsecond))
			releaseWakes(t, ctx, lease.Release, got)
		})
	}
}

// slotsHook answers every CLUSTER SLOTS of a node client with slots.
type slotsHook []redis.ClusterSlot

func (h slotsHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h slotsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.ClusterSlotsCmd); ok && err == nil {
			c.SetVal(h)
		}
		return err
	}
}

func (h slotsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// releaseWakes releases and requires the waiter (got) to be granted the
// lock within 5 s: by SPUBLISH, as its fallback is minutes away.
func releaseWakes(t *testing.T, ctx context.Context, release func(context.Context) error, got <-chan time.Time) {
	t.Helper()
	released := time.Now()
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		t.Logf("woken %v after the release", at.Sub(released).Round(time.Microsecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken within 5 s of the release")
	}
}
