package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/etcdlock"
	"github.com/oversold-lab/oversold/locking/etcdlock/internal/etcdlocktest"
	"github.com/oversold-lab/oversold/locking/locktest"
)

// config is what the suite opens a Locker from.
type config struct {
	Endpoints []string
	TTL       time.Duration
	Hardened  bool // as locking/backends composes it (hardened_test.go)
}

// open is how the suite opens this backend, here and in its helper
// processes: the recipe alone, unless c.Hardened.
func open(ctx context.Context, c config) (locking.Locker, error) {
	if c.Hardened {
		return openHardened(ctx, c)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	l, err := etcdlock.New(ctx, cli, etcdlock.Config{TTL: c.TTL})
	if err != nil {
		cli.Close()
		return nil, err
	}
	return locktest.Closing(l, cli.Close), nil
}

func TestMain(m *testing.M) { locktest.Main(m, open) }

// ttl is etcd's minimum lease TTL with default election settings (1.5
// election timeouts, rounded up to whole seconds).
const ttl = 2 * time.Second

func TestConformance(t *testing.T) { conformance(t, testbed.Etcd(t), false) }

// The same suite on a three-member cluster: leases, watches and revisions
// as Raft serves them, from any member.
func TestConformanceCluster(t *testing.T) { conformance(t, testbed.EtcdCluster(t), false) }

func conformance(t *testing.T, endpoints []string, hardened bool) {
	locktest.Run(t, locktest.Backend[config]{
		Name:   "etcd",
		Config: config{Endpoints: endpoints, TTL: ttl, Hardened: hardened},
		TTL:    ttl,
		// Replace the holder's key (the oldest in the key's queue) with a
		// rival's key without a lease, which then holds the lock.
		TakeOver: func(ctx context.Context, key string) (func(context.Context) error, error) {
			rival := queue(key) + "rival"
			err := withClient(endpoints, func(c *clientv3.Client) error {
				resp, err := c.Get(ctx, queue(key), clientv3.WithFirstCreate()...)
				if err != nil {
					return err
				}
				if len(resp.Kvs) == 0 {
					return errors.New("no holder to take over from")
				}
				_, err = c.Txn(ctx).Then(clientv3.OpDelete(string(resp.Kvs[0].Key)), clientv3.OpPut(rival, "")).Commit()
				return err
			})
			return func(ctx context.Context) error {
				return withClient(endpoints, func(c *clientv3.Client) error {
					_, err := c.Delete(ctx, rival)
					return err
				})
			}, err
		},
		QueueConfig: &config{Endpoints: endpoints, TTL: ttl, Hardened: hardened},
		Leftovers:   queueLength(endpoints),
		State: func(ctx context.Context) (state string, err error) {
			err = withClient(endpoints, func(c *clientv3.Client) error {
				st, err := c.Status(ctx, endpoints[0])
				if err == nil {
					state = fmt.Sprintf("etcd db %d bytes, %d in use, revision %d", st.DbSize, st.DbSizeInUse, st.Header.Revision)
				}
				return err
			})
			return state, err
		},
		Footprint: func(ctx context.Context) (map[string]int, error) {
			conns, err := testbed.Connections(endpoints...)
			if err != nil {
				return nil, err
			}
			fp := map[string]int{"connections": conns}
			for _, ep := range endpoints {
				w, err := metric(ctx, ep, "etcd_debugging_mvcc_watcher_total")
				if err != nil {
					return nil, err
				}
				fp["watches"] += w
			}
			err = withClient(endpoints, func(c *clientv3.Client) error {
				resp, err := c.Leases(ctx)
				if err == nil {
					fp["leases"] = len(resp.Leases)
				}
				return err
			})
			return fp, err
		},
		Servers: endpoints,
		Through: func(addrs []string) config { return config{Endpoints: addrs, TTL: ttl, Hardened: hardened} },
		Expiry:  ttl,
	})
}

// metric reads a gauge from etcd's /metrics on endpoint.
func metric(ctx context.Context, endpoint, name string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f), err
		}
	}
	return 0, fmt.Errorf("etcd %s: no metric %s", endpoint, name)
}

// noKeepAlive leaves no idle connection (nor its goroutines) behind.
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// queue is the prefix of key's queue.
func queue(key string) string { return etcdlock.DefaultPrefix + "/" + url.PathEscape(key) + "/" }

// queueLength counts the keys in a key's queue (holder and waiters).
func queueLength(endpoints []string) func(ctx context.Context, key string) (int, error) {
	return func(ctx context.Context, key string) (n int, err error) {
		err = withClient(endpoints, func(c *clientv3.Client) error {
			resp, err := c.Get(ctx, queue(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err == nil {
				n = int(resp.Count)
			}
			return err
		})
		return n, err
	}
}

var withClient = etcdlocktest.WithClient

// The tests below cover what is particular to etcd; the contract itself is
// the suite's.

func newLocker(tb testing.TB, endpoints []string) *etcdlock.Locker {
	tb.Helper()
	cli := etcdlocktest.Client(tb, endpoints)
	l, err := etcdlock.New(tb.Context(), cli, etcdlock.Config{TTL: ttl})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

// A revoked session loses its leases, and the Locker grants itself a new
// one for the next Acquire.
func TestLostWhenLeaseRevoked(t *testing.T) {
	endpoints := testbed.Etcd(t)
	l := newLocker(t, endpoints)
	key := testbed.Prefix(t) + "/sku"
	lease, err := l.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	err = withClient(endpoints, func(c *clientv3.Client) error {
		resp, err := c.Get(t.Context(), queue(key), clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 {
			return fmt.Errorf("queue: %v, %v", resp, err)
		}
		_, err = c.Revoke(t.Context(), clientv3.LeaseID(resp.Kvs[0].Lease))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Lost():
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("Lost still open after the session lease was revoked")
	}
	if err := lease.Release(t.Context()); !errors.Is(err, locking.ErrNotHeld) {
		t.Errorf("release = %v, want ErrNotHeld", err)
	}
	again, err := l.Acquire(t.Context(), key)
	if err != nil {
		t.Fatalf("acquire on a new session: %v", err)
	}
	if again.Token() <= lease.Token() {
		t.Errorf("token %d after %d", again.Token(), lease.Token())
	}
	time.Sleep(ttl / 2) // past a renewal: the new session is kept alive
	select {
	case <-again.Lost():
		t.Error("the lease on the new session is lost")
	default:
	}
	if err := again.Release(t.Context()); err != nil {
		t.Error(err)
	}
}

// A holder cut off from etcd cannot know whether its lease still lives:
// Lost must close by the TTL, before the server could expire it, and the
// Locker must serve again once the server is back.
func TestLostWhenServerPaused(t *testing.T) {
	srv := locktest.PrivateServer(t, testbed.StartEtcd)
	locktest.LostWhenServerPaused(t, srv, newLocker(t, []string{srv.Addr}), ttl)
}

func BenchmarkAcquireRelease(b *testing.B) { acquireRelease(b, newLocker(b, testbed.Etcd(b))) }

func acquireRelease(b *testing.B, l locking.Locker) {
	key := testbed.Prefix(b) + "/sku"
	for b.Loop() {
		lease, err := l.Acquire(b.Context(), key)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHotKey hands one key between 8 contenders, each with its own
// Locker (its own session, as 8 replicas would have).
func BenchmarkHotKey(b *testing.B) {
	endpoints := testbed.Etcd(b)
	hotKey(b, func() locking.Locker { return newLocker(b, endpoints) })
}

func hotKey(b *testing.B, newLocker func() locking.Locker) {
	const contenders = 8
	key := testbed.Prefix(b) + "/hot"
	lockers := make([]locking.Locker, contenders)
	for i := range lockers {
		lockers[i] = newLocker()
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	began := time.Now()
	for _, l := range lockers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				lease, err := l.Acquire(b.Context(), key)
				if err != nil {
					b.Error(err)
					return
				}
				if err := lease.Release(b.Context()); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "handoffs/s")
}

// A cancelled Acquire returns at once even when the delete of its key
// cannot reach the server; the delete lands once the server is back.
func TestCancelWhileServerPaused(t *testing.T) {
	srv := locktest.PrivateServer(t, testbed.StartEtcd)
	endpoints := []string{srv.Addr}
	locktest.CancelWhileServerPaused(t, locktest.Backend[config]{
		Name:      "etcd",
		Config:    config{Endpoints: endpoints, TTL: 5 * time.Second}, // outlives the pause
		TTL:       5 * time.Second,
		Leftovers: queueLength(endpoints),
	}, srv)
}

// Every grant and every release is a revision, which etcd keeps until it is
// compacted. What the locks leave over many distinct keys must all be
// compactable: once compacted at the current revision (as the server's
// auto-compaction does, every 5 minutes with the testbed's and compose's
// flags) and defragmented, the database is back to its size before the run,
// and no key or lease is left. OVERSOLD_LOCKTEST_KEYS sets the number of
// keys (2000 by default); a soak long enough to span the server's own
// compactions logs the database's size every 30 s.
func TestCompactionBoundsDatabase(t *testing.T) {
	srv := locktest.PrivateServer(t, testbed.StartEtcd)
	endpoints := []string{srv.Addr}
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("OVERSOLD_LOCKTEST_KEYS")); err == nil && v > 0 {
		n = v
	}
	cli := etcdlocktest.Client(t, endpoints)
	status := func() *clientv3.StatusResponse {
		t.Helper()
		st, err := cli.Status(t.Context(), endpoints[0])
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	before := status()
	// A longer TTL than the suite's: a soak on a busy machine would lose
	// its session now and then, which is not what this test is about.
	l, err := etcdlock.New(t.Context(), cli, etcdlock.Config{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var (
		lost     atomic.Int64 // releases that found their session gone
		next     atomic.Int64
		wg       sync.WaitGroup
		finished = make(chan struct{})
		sampled  = make(chan struct{})
	)
	began := time.Now()
	go func() {
		defer close(sampled)
		tick := time.NewTicker(30 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
			case <-finished:
				return
			}
			if st, err := cli.Status(t.Context(), endpoints[0]); err == nil {
				t.Logf("%v: %d keys, db %d bytes, %d in use, revision %d", time.Since(began).Round(time.Second),
					min(next.Load(), int64(n)), st.DbSize, st.DbSizeInUse, st.Header.Revision)
			}
		}
	}()
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				lease, err := l.Acquire(t.Context(), fmt.Sprintf("sku/%d", i))
				if err != nil {
					t.Errorf("acquire key %d: %v", i, err)
					return
				}
				switch err := lease.Release(t.Context()); {
				case errors.Is(err, locking.ErrNotHeld):
					lost.Add(1) // its session expired: the key went with it
				case err != nil:
					t.Errorf("release key %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(began)
	close(finished)
	<-sampled
	if t.Failed() {
		return
	}
	grown := status()
	if _, err := cli.Compact(t.Context(), grown.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	compacted := status()
	if _, err := cli.Defragment(t.Context(), endpoints[0]); err != nil {
		t.Fatal(err)
	}
	defragged := status()
	t.Logf("%d distinct keys (%d releases found their session lost) in %v: db %d bytes (%d in use) before; %d (%d in use) at revision %d after; %d in use once compacted; %d once defragmented",
		n, lost.Load(), took.Round(time.Millisecond), before.DbSize, before.DbSizeInUse, grown.DbSize, grown.DbSizeInUse,
		grown.Header.Revision, compacted.DbSizeInUse, defragged.DbSize)
	if left, err := cli.Get(t.Context(), etcdlock.DefaultPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		t.Fatal(err)
	} else if left.Count != 0 {
		t.Errorf("%d lock keys left after every lease was released", left.Count)
	}
	// The Locker's session lease is all that may remain: a few hundred bytes.
	if slack := int64(64 << 10); defragged.DbSize > before.DbSize+slack {
		t.Errorf("database %d bytes once compacted and defragmented, %d before %d distinct keys: the locks left state behind",
			defragged.DbSize, before.DbSize, n)
	}
}

// A session granted while Close runs must be revoked by it, not left on the
// server renewed by a keepalive nobody stops. The hook holds a grant open
// until Close has begun (marked the Locker closed).
func TestCloseRevokesSessionGrantedMeanwhile(t *testing.T) {
	srv := locktest.PrivateServer(t, testbed.StartEtcd)
	endpoints := []string{srv.Addr}
	cli := etcdlocktest.Client(t, endpoints)
	l, err := etcdlock.New(t.Context(), cli, etcdlock.Config{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Lose the first session, so that the next Acquire grants another.
	held, err := l.Acquire(t.Context(), "sku/close")
	if err != nil {
		t.Fatal(err)
	}
	leases, err := cli.Leases(t.Context())
	if err != nil || len(leases.Leases) != 1 {
		t.Fatalf("leases = %v, %v; want the session's", leases, err)
	}
	if _, err := cli.Revoke(t.Context(), leases.Leases[0].ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Lost():
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("Lost still open after the session lease was revoked")
	}
	closed := make(chan error, 1)
	etcdlock.AfterGrant(l, func() {
		go func() { closed <- l.Close() }()
		for !etcdlock.Closing(l) {
			time.Sleep(time.Millisecond)
		}
	})
	if lease, err := l.Acquire(t.Context(), "sku/close"); err == nil {
		lease.Release(t.Context())
		t.Error("Acquire granted a lease while the Locker closed")
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	// Beyond a renewal period, so a session still renewed would show.
	time.Sleep(ttl / 2)
	if leases, err := cli.Leases(t.Context()); err != nil {
		t.Fatal(err)
	} else if len(leases.Leases) != 0 {
		t.Errorf("%d leases left on the server after Close", len(leases.Leases))
	}
}

// Close ends the Locker's requests under way, even when etcd does not
// answer: it returns within its revoke bound, well before the TTL. Here
// a Release that could not reach etcd left its delete to the background,
// whose try would otherwise wait up to the TTL.
func TestClosePromptWhenEtcdUnreachable(t *testing.T) {
	endpoints := testbed.Etcd(t)
	proxy, err := testbed.StartProxy("etcd", endpoints[0])
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	cli := etcdlocktest.Client(t, []string{proxy.Addr()})
	const long = 30 * time.Second
	l, err := etcdlock.New(t.Context(), cli, etcdlock.Config{TTL: long, Prefix: testbed.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.Acquire(t.Context(), "sku")
	if err != nil {
		t.Fatal(err)
	}
	// Requests are swallowed, nothing is answered.
	if err := proxy.Cut(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := lease.Release(ctx); !errors.Is(err, locking.ErrUnavailable) {
		t.Fatalf("release through a black hole = %v, want ErrUnavailable", err)
	}
	began := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case err := <-closed:
		took := time.Since(began)
		t.Logf("Close returned %v after it began, etcd unreachable (TTL %v): %v", took.Round(time.Millisecond), long, err)
		if err == nil {
			t.Error("Close revoked through a black hole without error")
		}
		if bound := etcdlock.CloseTimeout + time.Second; took > bound {
			t.Errorf("Close took %v, more than its bound %v", took, bound)
		}
	case <-time.After(long):
		t.Fatalf("Close still running after the TTL %v", long)
	}
}
