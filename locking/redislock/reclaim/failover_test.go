package reclaim_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/redislock"
)

// A failover can lose a release: a lease granted (SET PX TTL) before the
// replica stopped receiving writes and released after it leaves its key on
// the replica, which keeps it once promoted for the rest of its PX, up to a
// TTL (30 s in the lab's redis-failover), though nobody holds it. Every
// acquirer then waited its whole lock wait in vain: 503 lock_timeout on that
// key until the lab run ended. The Locker that released the lease knows
// that nobody holds that owner: its waiter releases the key again and the
// lock moves on, to its waiter and to another process's.
func TestFailoverLostRelease(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	master, replica := replicated(t, ctx)
	var target atomic.Value // where the Lockers' connections go: the master, then the promoted replica
	target.Store(master.Addr)
	const ttl = 30 * time.Second // the lab's TTL in this fault (Redisson's default)
	a, b := switchable(t, &target, ttl), switchable(t, &target, ttl)
	mc := redis.NewClient(&redis.Options{Addr: master.Addr, MaxRetries: -1})
	defer mc.Close()
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer rc.Close()

	const key = "failover"
	held, err := a.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := mc.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("the replica did not acknowledge the grant: %d, %v", n, err)
	}
	// The cut: the replica leaves the master (it is the promoted one from
	// now on), and the release reaches the master only.
	if err := rc.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("release on the master: %v", err)
	}
	if err := master.Kill(); err != nil {
		t.Fatal(err)
	}
	target.Store(replica.Addr)
	pttl := rc.PTTL(ctx, lockKey(key)).Val()
	if pttl < 10*time.Second {
		t.Fatalf("the promoted replica's key has %v left, want the released lease's (about %v)", pttl, ttl)
	}

	// Both processes order the key again, within the service's lock wait.
	const lockWait = 5 * time.Second
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, l := range []*redislock.Locker{b, a} {
		wg.Go(func() {
			wctx, wcancel := context.WithTimeout(ctx, lockWait)
			defer wcancel()
			began := time.Now()
			lease, err := l.Acquire(wctx, key)
			t.Logf("acquire after the failover: %v, %v", time.Since(began), err)
			if err != nil {
				errs <- fmt.Errorf("acquire after the failover: %w (the released lease's key had %v left)", err, pttl)
				return
			}
			if lease.Token() <= held.Token() {
				errs <- fmt.Errorf("token %d after the failover, not above the lost lease's %d (the promoted replica's counter)", lease.Token(), held.Token())
			}
			errs <- lease.Release(ctx)
		})
		time.Sleep(50 * time.Millisecond) // b first: a's waiter frees the key, b is served too
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// A lease of this Locker that is still held, and a lock handed to a waiter
// of this Locker that has not heard it yet, are not released by another
// waiter of the same Locker: waiters release only keys whose owner's lease
// has ended. Contenders in one Locker (one process) never overlap.
func TestOwnLiveLeasesKept(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	l := newLocker(t, testbed.Redis(t), redislock.Config{TTL: 10 * time.Second})
	key := "own-live-" + testbed.Prefix(t)

	held, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if lease, err := l.Acquire(wctx, key); err == nil {
		lease.Release(ctx)
		t.Fatalf("a second Acquire in the same Locker got token %d while token %d is held", lease.Token(), held.Token())
	}
	wcancel()
	select {
	case <-held.Lost():
		t.Fatal("the held lease was lost to a waiter of its own Locker")
	default:
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Handoffs between contenders of one Locker.
	const contenders, rounds = 6, 40
	var (
		inside  atomic.Int32
		overlap atomic.Int32
		wg      sync.WaitGroup
	)
	start := make(chan struct{})
	for range contenders {
		wg.Go(func() {
			<-start
			for range rounds {
				lease, err := l.Acquire(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) > 1 {
					overlap.Add(1)
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				if err := lease.Release(ctx); err != nil {
					t.Errorf("release of token %d: %v", lease.Token(), err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if n := overlap.Load(); n > 0 {
		t.Fatalf("%d times two contenders of one Locker held the lock at once", n)
	}
}

// replicated starts a master and a replica of it, in sync.
func replicated(t *testing.T, ctx context.Context) (master, replica *testbed.Server) {
	t.Helper()
	master, err := testbed.StartRedis(ctx, testbed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Stop() })
	host, port, _ := net.SplitHostPort(master.Addr)
	replica, err = testbed.StartRedis(ctx, testbed.Options{Args: []string{"--replicaof", host, port}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { replica.Stop() })
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer rc.Close()
	for !strings.Contains(rc.Info(ctx, "replication").Val(), "master_link_status:up") {
		select {
		case <-ctx.Done():
			t.Fatal("the replica did not sync")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return master, replica
}

// switchable is a Locker whose connections go where target says: a
// failover as a client sees it, once the old master's connections break.
func switchable(t *testing.T, target *atomic.Value, ttl time.Duration) *redislock.Locker {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr: "failover",
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, target.Load().(string))
		},
	})
	l := redislock.New(c, hardened(redislock.Config{TTL: ttl}))
	t.Cleanup(func() { l.Close(); c.Close() })
	return l
}
