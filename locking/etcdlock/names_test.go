package etcdlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/etcdlock"
)

// names lists the keys in key's queue, oldest first.
func names(t *testing.T, endpoints []string, key string) []string {
	t.Helper()
	var out []string
	err := withClient(endpoints, func(c *clientv3.Client) error {
		resp, err := c.Get(t.Context(), queue(key), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		for _, kv := range resp.Kvs {
			out = append(out, string(kv.Key))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A hot key's turns on one Locker reuse one name, as concurrency.Mutex
// does: etcd keeps a deleted key in its index until compaction and every
// look at the queue walks it, so a new name per turn made each turn cost
// the server more. Two acquisitions of one Locker on one key still have
// names of their own: the second waits for the first.
func TestHotKeyReusesName(t *testing.T) {
	endpoints := testbed.Etcd(t)
	l := newLocker(t, endpoints)
	key := testbed.Prefix(t) + "/sku"
	seen := map[string]bool{}
	for range 10 {
		lease, err := l.Acquire(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names(t, endpoints, key) {
			seen[n] = true
		}
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != 1 {
		t.Errorf("10 turns used %d names, want 1: %v", len(seen), seen)
	}

	first, err := l.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan locking.Lease, 1)
	go func() {
		lease, err := l.Acquire(t.Context(), key)
		if err != nil {
			t.Error(err)
		}
		granted <- lease
	}()
	waitFor(t, func() bool { return len(names(t, endpoints, key)) == 2 })
	select {
	case <-granted:
		t.Fatal("a second acquisition on the same Locker was granted beside the holder")
	case <-time.After(200 * time.Millisecond):
	}
	if err := first.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if second := <-granted; second != nil {
		second.Release(t.Context())
	}
}

// A name whose delete did not answer is never used again in the session:
// that delete may still land, on the next key of the same name, and free
// the lock under its holder.
func TestUnansweredReleaseRetiresName(t *testing.T) {
	endpoints := testbed.Etcd(t)
	l := newLocker(t, endpoints)
	key := testbed.Prefix(t) + "/sku"
	lease, err := l.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	before := names(t, endpoints, key)
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	if err := lease.Release(cancelled); err == nil {
		t.Fatal("Release with a cancelled ctx reported success")
	}
	waitFor(t, func() bool { return len(names(t, endpoints, key)) == 0 }) // the background delete
	again, err := l.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release(t.Context())
	if after := names(t, endpoints, key); len(after) != 1 || after[0] == before[0] {
		t.Errorf("queue %v after an unanswered release of %v: want a new name", after, before)
	}
}

// A waiter whose predecessor's name is deleted and made again between its
// look at the queue and its watch does not wait for the new key, which is
// behind it (and waits for it): it looks again and holds the lock.
func TestWaiterSkipsReusedName(t *testing.T) {
	endpoints := testbed.Etcd(t)
	a, b := newLocker(t, endpoints), newLocker(t, endpoints)
	key := testbed.Prefix(t) + "/sku"
	held, err := a.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	var (
		once    sync.Once
		aAgain  = make(chan locking.Lease, 1)
		oldName = names(t, endpoints, key)[0]
	)
	etcdlock.BeforeWatch(b, func() {
		once.Do(func() {
			if err := held.Release(context.Background()); err != nil {
				t.Error(err)
			}
			go func() {
				lease, err := a.Acquire(context.Background(), key)
				if err != nil {
					t.Error(err)
				}
				aAgain <- lease
			}()
			// a's key again, now behind b's.
			waitFor(t, func() bool { n := names(t, endpoints, key); return len(n) == 2 && n[1] == oldName })
		})
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	lease, err := b.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("the waiter: %v (it waited for the key behind it)", err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if l := <-aAgain; l != nil {
		l.Release(t.Context())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
	}
}
