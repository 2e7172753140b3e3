package namereuse_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/etcdlock"
	"github.com/oversold-lab/oversold/locking/etcdlock/internal/etcdlocktest"
	"github.com/oversold-lab/oversold/locking/etcdlock/namereuse"
	"github.com/oversold-lab/oversold/locking/etcdlock/quickwake"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// ttl is etcd's minimum lease TTL with default election settings.
const ttl = 2 * time.Second

// locker is an etcdlock.Locker that names its keys with namereuse.
type locker struct {
	*etcdlock.Locker
	mu    sync.Mutex
	names *namereuse.Names // the current session's
	wait  *hookWaiter
}

// hookWaiter calls before, if set, when a waiter has found its predecessor
// and is about to watch it.
type hookWaiter struct {
	etcdlock.Waiter
	before func()
}

func (w *hookWaiter) WaitDelete(ctx context.Context, cli *clientv3.Client, pred *mvccpb.KeyValue, seen int64) error {
	if w.before != nil {
		w.before()
	}
	return w.Waiter.WaitDelete(ctx, cli, pred, seen)
}

// newLocker opens a Locker whose waiters wait with w (the recipe's when nil).
func newLocker(t *testing.T, endpoints []string, w etcdlock.Waiter) *locker {
	t.Helper()
	cli := etcdlocktest.Client(t, endpoints)
	if w == nil {
		w = etcdlock.WatchDelete{}
	}
	l := &locker{wait: &hookWaiter{Waiter: w}}
	cfg := etcdlock.Config{TTL: ttl, Wait: l.wait, Names: func() etcdlock.Namer {
		ns := namereuse.New().(*namereuse.Names)
		l.mu.Lock()
		l.names = ns
		l.mu.Unlock()
		return ns
	}}
	var err error
	if l.Locker, err = etcdlock.New(t.Context(), cli, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func (l *locker) current() *namereuse.Names {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.names
}

// queue is the prefix of key's queue.
func queue(key string) string { return etcdlock.DefaultPrefix + "/" + url.PathEscape(key) + "/" }

var withClient = etcdlocktest.WithClient

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
	l := newLocker(t, endpoints, nil)
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
	l := newLocker(t, endpoints, nil)
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

// A key whose every acquisition ended is forgotten, even one that retired
// names (a cancelled Acquire always does, a Release whose answer was lost
// too), so a Locker's memory follows the keys in use; and once forgotten,
// a key still never gets a retired name back: its numbers start above
// every number it handed out (a name retired while its delete may still
// land would free the lock under the next holder of that name).
func TestForgottenKeyKeepsNamesRetired(t *testing.T) {
	endpoints := testbed.Etcd(t)
	l := newLocker(t, endpoints, nil)
	key := testbed.Prefix(t) + "/sku"
	holder, err := l.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	waited := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, key)
		if lease != nil {
			lease.Release(t.Context())
		}
		waited <- err
	}()
	waitFor(t, func() bool { return len(names(t, endpoints, key)) == 2 })
	retired := names(t, endpoints, key) // the holder's, the waiter's
	cancel()
	if err := <-waited; err == nil {
		t.Fatal("a cancelled waiter was granted beside the holder")
	}
	if err := holder.Release(ctx); err == nil {
		t.Fatal("Release with a cancelled ctx reported success")
	}
	waitFor(t, func() bool { return len(names(t, endpoints, key)) == 0 }) // the background deletes
	if n := l.current().Entries(); n != 0 {
		t.Errorf("an idle key with retired names: the session keeps %d entries, want 0", n)
	}

	again, err := l.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	name := names(t, endpoints, key)[0]
	if slices.Contains(retired, name) {
		t.Errorf("the forgotten key handed out %s again, retired with %v", name, retired)
	}
	if err := again.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A clean turn leaves nothing retired: the next turn reuses its name.
	last, err := l.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer last.Release(t.Context())
	if reused := names(t, endpoints, key)[0]; reused != name {
		t.Errorf("the turn after a clean release of %s took %s, want the same name", name, reused)
	}
}

// A name retired on one key does not move the names of a hot key in
// another floor bucket: its turns, idle in between, keep reusing one name.
func TestRetiredNameLeavesOtherKeysNames(t *testing.T) {
	endpoints := testbed.Etcd(t)
	l := newLocker(t, endpoints, nil)
	hot, cold := testbed.Prefix(t)+"/hot", ""
	for i := 0; cold == "" && i < 100; i++ {
		if k := fmt.Sprint(testbed.Prefix(t), "/cold", i); !l.current().SameFloor(queue(hot), queue(k)) {
			cold = k
		}
	}
	if cold == "" {
		t.Fatal("100 keys share the hot key's floor")
	}
	turn := func(key string, ctx context.Context) string {
		t.Helper()
		lease, err := l.Acquire(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		name := names(t, endpoints, key)[0]
		if err := lease.Release(ctx); (err == nil) != (ctx.Err() == nil) {
			t.Fatalf("Release: %v with ctx %v", err, ctx.Err())
		}
		return name
	}
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	first := turn(hot, t.Context())
	turn(cold, cancelled) // retires the cold key's name
	if again := turn(hot, t.Context()); again != first {
		t.Errorf("the hot key's turn after a retirement on another key took %s, want %s", again, first)
	}
}

// Many keys, each with a cancelled waiter and a Release that did not
// answer: none keeps an entry in the session once its key is idle.
func TestIdleKeysLeaveNoNames(t *testing.T) {
	const keys = 50
	endpoints := testbed.Etcd(t)
	l, other := newLocker(t, endpoints, nil), newLocker(t, endpoints, nil)
	base := testbed.Prefix(t) + "/k"
	queued := func() int64 {
		var n int64
		err := withClient(endpoints, func(c *clientv3.Client) error {
			resp, err := c.Get(t.Context(), etcdlock.DefaultPrefix+"/"+url.PathEscape(base), clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err == nil {
				n = resp.Count
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var held []locking.Lease
	for i := range keys {
		lease, err := other.Acquire(t.Context(), fmt.Sprint(base, i))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, lease)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			if lease, err := l.Acquire(ctx, fmt.Sprint(base, i)); err == nil {
				t.Errorf("key %d: a cancelled waiter was granted beside the holder", i)
				lease.Release(t.Context())
			}
		})
	}
	waitFor(t, func() bool { return queued() == 2*keys })
	cancel()
	wg.Wait()
	for _, lease := range held {
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for i := range keys {
		lease, err := l.Acquire(t.Context(), fmt.Sprint(base, i))
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err == nil {
			t.Fatal("Release with a cancelled ctx reported success")
		}
	}
	waitFor(t, func() bool { return queued() == 0 }) // the background deletes
	if n := l.current().Entries(); n != 0 {
		t.Errorf("%d idle keys with retired names: the session keeps %d entries, want 0", keys, n)
	}
}

// A waiter whose predecessor's name is deleted and made again between its
// look at the queue and its watch does not wait for the new key, which is
// behind it (and waits for it): it looks again and holds the lock. Both
// waiters: the recipe's and quickwake's.
func TestWaiterSkipsReusedName(t *testing.T) {
	for name, w := range map[string]etcdlock.Waiter{"recipe": etcdlock.WatchDelete{}, "quickwake": quickwake.Waiter{}} {
		t.Run(name, func(t *testing.T) { waiterSkipsReusedName(t, w) })
	}
}

func waiterSkipsReusedName(t *testing.T, w etcdlock.Waiter) {
	endpoints := testbed.Etcd(t)
	a, b := newLocker(t, endpoints, w), newLocker(t, endpoints, w)
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
	b.wait.before = func() {
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
	}
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
