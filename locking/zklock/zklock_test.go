package zklock_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/zklock"
	"github.com/oversold-lab/oversold/locking/zklock/internal/zklocktest"
)

// config is the suite's, shared with the hardening packages' tests.
type config = zklocktest.Config

// open is how the suite opens this backend, here and in its helper
// processes. The Locker dials ZooKeeper itself: the session is the lease.
func open(ctx context.Context, c config) (locking.Locker, error) {
	return zklock.New(ctx, c.Servers, zklock.Config{SessionTimeout: c.TTL})
}

func TestMain(m *testing.M) { locktest.Main(m, open) }

// ttl is the suite's session timeout.
const ttl = zklocktest.TTL

func TestConformance(t *testing.T) { conformance(t, testbed.ZooKeeper(t)) }

// The same suite on a three-node ensemble: the holder's session, watches
// and sequence numbers as a quorum serves them, from any of its servers.
func TestConformanceEnsemble(t *testing.T) { conformance(t, testbed.ZooKeeperEnsemble(t)) }

func conformance(t *testing.T, servers []string) {
	b := zklocktest.Backend(servers)
	b.State = func(ctx context.Context) (state string, err error) {
		err = withConn(ctx, servers, func(c *zk.Conn) error {
			keys, _, err := c.Children(zklock.DefaultRoot)
			state = fmt.Sprintf("%d key parents under %s", len(keys), zklock.DefaultRoot)
			if errors.Is(err, zk.ErrNoNode) {
				return nil
			}
			return err
		})
		return state, err
	}
	b.Footprint = func(ctx context.Context) (map[string]int, error) {
		conns, err := testbed.Connections(servers...)
		if err != nil {
			return nil, err
		}
		fp := map[string]int{"connections": conns}
		for _, addr := range servers {
			// "N connections watching M paths\nTotal watches:K"
			wchs, err := testbed.ZKFourLetter(ctx, addr, "wchs")
			if err != nil {
				return nil, err
			}
			_, total, ok := strings.Cut(wchs, "Total watches:")
			w, err := strconv.Atoi(strings.TrimSpace(total))
			if !ok || err != nil {
				return nil, fmt.Errorf("wchs: %q", wchs)
			}
			fp["watches"] += w
		}
		err = withConn(ctx, servers, func(c *zk.Conn) error {
			keys, _, err := c.Children(zklock.DefaultRoot)
			fp["key parents"] = len(keys)
			if errors.Is(err, zk.ErrNoNode) {
				return nil // the root is a container too, reaped once empty
			}
			return err
		})
		return fp, err
	}
	locktest.Run(t, b)
}

var (
	parent      = zklocktest.Parent
	children    = zklocktest.Children
	queueLength = zklocktest.QueueLength
	withConn    = zklocktest.WithConn
	eventually  = zklocktest.Eventually
)

// The tests below cover what is particular to ZooKeeper; the contract
// itself is the suite's.

// A server that clamps the session timeout must be obeyed: the testbed's
// ZooKeeper grants at least 400 ms.
func TestNegotiatedSessionTimeout(t *testing.T) {
	const asked = 100 * time.Millisecond
	l, err := zklock.New(t.Context(), testbed.ZooKeeper(t), zklock.Config{SessionTimeout: asked})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.SessionTimeout(); got <= asked {
		t.Errorf("SessionTimeout() = %v after asking for %v; the server grants more", got, asked)
	}
}

// Sequence numbers restart when the parent is removed and made again; the
// token (a pzxid) must not.
func TestTokenSurvivesParentRecreation(t *testing.T) {
	servers := testbed.ZooKeeper(t)
	l, err := zklock.New(t.Context(), servers, zklock.Config{SessionTimeout: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	key := testbed.Prefix(t) + "/sku"
	var last uint64
	for i := range 3 {
		lease, err := l.Acquire(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if tok := lease.Token(); tok <= last {
			t.Fatalf("grant %d: token %d, not above %d", i, tok, last)
		} else {
			last = tok
		}
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		// The Locker may have removed the empty parent itself already.
		err = withConn(t.Context(), servers, func(c *zk.Conn) error { return c.Delete(parent(key), -1) })
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			t.Fatal(err)
		}
	}
}

// A holder cut off from ZooKeeper cannot know whether its session still
// lives: Lost must close by the session timeout, before the server could
// expire it, and the Locker must serve again once the server is back.
func TestLostWhenServerPaused(t *testing.T) {
	srv := locktest.PrivateServer(t, testbed.StartZooKeeper)
	l, err := zklock.New(t.Context(), []string{srv.Addr}, zklock.Config{SessionTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	locktest.LostWhenServerPaused(t, srv, l, l.SessionTimeout())
}

func BenchmarkAcquireRelease(b *testing.B) {
	l, err := zklock.New(b.Context(), testbed.ZooKeeper(b), zklock.Config{SessionTimeout: ttl})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
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
	const contenders = 8
	servers := testbed.ZooKeeper(b)
	key := testbed.Prefix(b) + "/hot"
	lockers := make([]*zklock.Locker, contenders)
	for i := range lockers {
		l, err := zklock.New(b.Context(), servers, zklock.Config{SessionTimeout: ttl})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		lockers[i] = l
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

// A cancelled Acquire returns at once even when the delete of its node
// cannot reach the server; the delete lands once the server is back.
func TestCancelWhileServerPaused(t *testing.T) {
	srv := locktest.PrivateServer(t, testbed.StartZooKeeper)
	servers := []string{srv.Addr}
	locktest.CancelWhileServerPaused(t, locktest.Backend[config]{
		Name:      "zookeeper",
		Config:    config{Servers: servers, TTL: 4 * time.Second}, // outlives the pause
		TTL:       4 * time.Second,
		Leftovers: queueLength(servers),
	}, srv)
}

// A Release whose deletes keep failing must not give up while the session
// lives: a node left behind would hold the key until the holder's process
// ends. The connection breaks in place of sending each of the first six
// deletes (more than Release's own five tries); the seventh, from the
// background, must land, and a waiter then gets the key while the holder's
// session (another of its leases) lives on.
func TestReleaseRetriesUntilDeleted(t *testing.T) {
	servers := testbed.ZooKeeper(t)
	var failures atomic.Int32
	dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return &failDeletes{Conn: c, n: &failures}, nil
	}
	const timeout = 10 * time.Second // outlives six reconnects
	holder, err := zklock.New(t.Context(), servers, zklock.Config{SessionTimeout: timeout, Dialer: dial})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	rival, err := zklock.New(t.Context(), servers, zklock.Config{SessionTimeout: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer rival.Close()
	key, witness := testbed.Prefix(t)+"/sku", testbed.Prefix(t)+"/witness"
	held, err := holder.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	other, err := holder.Acquire(t.Context(), witness) // dies with the session only
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		lease, err := rival.Acquire(ctx, key)
		if err == nil {
			err = lease.Release(ctx)
		}
		granted <- err
	}()
	count := queueLength(servers)
	waitFor(t, func() bool { n, err := count(t.Context(), key); return err == nil && n == 2 })

	failures.Store(6)
	began := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = held.Release(ctx)
	t.Logf("Release returned %v after %v", err, time.Since(began).Round(time.Millisecond))
	select {
	case err := <-granted:
		if err != nil {
			t.Fatalf("rival: %v", err)
		}
		t.Logf("the rival got the key %v after the Release began", time.Since(began).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("the rival still waits 30s after the Release began: the holder's node was left behind")
	}
	if n := failures.Load(); n > 0 {
		t.Fatalf("only %d deletes were sent: the test proves nothing", 6-n)
	}
	if n, err := count(t.Context(), witness); err != nil || n != 1 {
		t.Fatalf("the holder's other node: %d, %v; its session ended, which frees the key by itself", n, err)
	}
	if err := other.Release(t.Context()); err != nil {
		t.Error(err)
	}
}

// failDeletes breaks the connection in place of sending a delete request,
// while *n is above zero (one fewer each time). go-zookeeper writes one
// whole packet per Write: length, xid, opcode.
type failDeletes struct {
	net.Conn
	n *atomic.Int32
}

const opDelete = 2

func (c *failDeletes) Write(p []byte) (int, error) {
	if len(p) >= 12 && int32(binary.BigEndian.Uint32(p[8:])) == opDelete && c.n.Add(-1) >= 0 {
		c.Conn.Close()
		return 0, errors.New("delete dropped")
	}
	return c.Conn.Write(p)
}

// waitFor polls ok for up to 10s.
func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	if !eventually(ok) {
		t.Fatal("condition not met within 10s")
	}
}
