package fairwake_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/redlock"
	"github.com/oversold-lab/oversold/locking/redlock/internal/redlocktest"
)

// An attempt abandoned while a node is stalled past the per-node timeout
// must not leave its key or its waiter's place on that node: the undo and
// the leave that end it are sent once the node's acquire request has ended,
// and they get their own time from then. Node 1 holds
// another owner's key (a "no"), node 2 is stopped for 250 ms (an fsync or
// fork stall), and one Acquire gives up after 60 ms: before the fix the
// undo and leave spent their timeout waiting behind the acquire request and
// were never sent, and node 2 kept the abandoned key for a TTL, or, with a
// live waiter queued first there (the attempt then queues instead of taking
// the key), the departed waiter's place. Both kinds of client: one that
// ignores ctx deadlines on the socket (the acquire request then ends only
// when node 2 answers) and one that honours them, as orderd's do (it is cut
// at 60 ms, and the undo needs a new connection, whose handshake node 2
// answers only once it resumes).
func TestAbandonedAttemptLeavesNothing(t *testing.T) {
	servers, addrs := redlocktest.OwnRedises(t)
	admins := redlocktest.Clients(t, addrs)
	for _, tc := range []struct {
		name string
		open func(addr string) redis.UniversalClient
	}{
		{"socket-timeouts", func(addr string) redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: addr}) }},
		{"ctx-deadlines", func(addr string) redis.UniversalClient {
			o, err := redisconn.Options(addr)
			if err != nil {
				t.Fatal(err)
			}
			// One idle connection: the acquire request's, closed when its
			// ctx ends, so the undo has to dial.
			o.MaxIdleConns = 1
			return redis.NewUniversalClient(o)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cs []redis.UniversalClient
			for _, a := range addrs {
				c := tc.open(a)
				t.Cleanup(func() { c.Close() })
				cs = append(cs, c)
			}
			l := warmLocker(t, cs)
			for _, queued := range []bool{false, true} {
				key := fmt.Sprintf("abandoned-%s-%v", tc.name, queued)
				lock := "lock:{" + key + "}"
				if err := admins[1].Set(t.Context(), lock, "rival", time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
				if queued {
					// A live waiter first on node 2: the attempt queues
					// there instead of taking the key, and its place is
					// what must go.
					now, err := admins[2].Time(t.Context()).Result()
					if err != nil {
						t.Fatal(err)
					}
					if err := admins[2].ZAdd(t.Context(), lock+":waiters", redis.Z{Score: 0, Member: rivalWaiter}).Err(); err != nil {
						t.Fatal(err)
					}
					if err := admins[2].ZAdd(t.Context(), lock+":alive", redis.Z{Score: float64(now.Add(time.Minute).UnixMilli()), Member: rivalWaiter}).Err(); err != nil {
						t.Fatal(err)
					}
				}
				if err := servers[2].Pause(); err != nil {
					t.Fatal(err)
				}
				resumed := make(chan error, 1)
				time.AfterFunc(250*time.Millisecond, func() { resumed <- servers[2].Resume() })
				ctx, cancel := context.WithTimeout(t.Context(), 60*time.Millisecond)
				lease, err := l.Acquire(ctx, key)
				cancel()
				if err == nil {
					lease.Release(t.Context())
					t.Fatal("Acquire got the lock with node 1 held by another owner and node 2 stopped")
				}
				if err := <-resumed; err != nil {
					t.Fatal(err)
				}
				// Well within the TTL and the waiter's life: a key or a
				// place left behind would still be there.
				deadline := time.Now().Add(2 * time.Second)
				for _, i := range []int{0, 2} {
					for {
						left := leftOn(t, admins[i], lock)
						if left == "" {
							break
						}
						if time.Now().After(deadline) {
							t.Fatalf("queue seeded %v: node %d, 2 s after node 2 resumed: %s", queued, i, left)
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
			}
		})
	}
}

// rivalWaiter is another Locker's waiter, put in a queue by the test.
const rivalWaiter = "rival:waiter"

// warmLocker returns a Locker on cs with a TTL of 4 s (a per-node timeout
// of 100 ms), its scripts loaded and its connections open.
func warmLocker(t *testing.T, cs []redis.UniversalClient) *redlock.Locker {
	l, err := backends.NewRedlock(cs, redlock.Config{TTL: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	warm, err := l.Acquire(t.Context(), "warm-"+testbed.Prefix(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	return l
}

// leftOn describes what a lock key has on one node besides another owner's
// "rival" key, rivalWaiter and tombstones: an owner's key, queued or live
// waiters; "" if nothing.
func leftOn(t *testing.T, c redis.UniversalClient, lock string) string {
	t.Helper()
	owner, err := c.Get(t.Context(), lock).Result()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	if owner == "rival" {
		owner = ""
	}
	var left string
	if owner != "" {
		pttl, _ := c.PTTL(t.Context(), lock).Result()
		left = "stray key of an abandoned attempt, PTTL " + pttl.String()
	}
	for _, set := range []string{":waiters", ":alive"} {
		members, err := c.ZRange(t.Context(), lock+set, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range members {
			if m != rivalWaiter && !strings.HasPrefix(m, "gone:") { // tombstones lapse with the TTL
				left += " " + set + " keeps the departed waiter " + m
			}
		}
	}
	return left
}

// An undo that overtakes the acquire it undoes must still leave nothing:
// node 2's acquire request is held back 300 ms on its connection (as
// retransmissions would; the client has given up on it after 60 ms and
// closed that connection), while the undo and the leave go on a fresh
// connection and arrive first. They bury the attempt's owner and the
// waiter there, and the late acquire is refused.
// Without the tombstones the late acquire took the key for a TTL.
func TestOvertakenAcquireRefused(t *testing.T) {
	addrs := testbed.Redises(t, 3)
	admins := redlocktest.Clients(t, addrs)
	var hold atomic.Bool // the next write on a connection to node 2 is held back
	var cs []redis.UniversalClient
	for i, a := range addrs {
		o, err := redisconn.Options(a)
		if err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &heldConn{Conn: c, hold: &hold, key: "lock:{overtaken}", delay: 300 * time.Millisecond}, nil
			}
		}
		c := redis.NewUniversalClient(o)
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	l := warmLocker(t, cs)
	const key = "overtaken"
	lock := "lock:{" + key + "}"
	if err := admins[1].Set(t.Context(), lock, "rival", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	hold.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Millisecond)
	lease, err := l.Acquire(ctx, key)
	cancel()
	if err == nil {
		lease.Release(t.Context())
		t.Fatal("Acquire got the lock with node 1 held by another owner")
	}
	if hold.Load() {
		t.Fatal("no request to node 2 was held back: the test proves nothing")
	}
	time.Sleep(time.Second) // the held acquire lands at 300 ms
	for _, i := range []int{0, 2} {
		if left := leftOn(t, admins[i], lock); left != "" {
			t.Errorf("node %d, 1 s after the attempt: %s", i, left)
		}
	}
}

// heldConn holds back the first script call (EVALSHA, or EVAL) on key
// written while hold is set by delay, with every later write of the
// connection behind it (in order, as TCP would deliver them), even past
// Close. Other writes pass: another write to the node made first (a
// waiter's SUBSCRIBE, a request of the warm-up still under way, on
// another connection of the pool) must not take the hold, and let the
// acquire through at once (it did, once in CI on the container testbed).
type heldConn struct {
	net.Conn
	hold  *atomic.Bool
	key   string // the lock key whose script call is held
	delay time.Duration

	mu      sync.Mutex
	pending chan []byte // nil until a write is held back
	closed  bool
}

func (c *heldConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil && isScriptCall(p, c.key) && c.hold.CompareAndSwap(true, false) {
		c.pending = make(chan []byte, 64)
		go c.flush(time.Now().Add(c.delay))
	}
	if c.pending == nil {
		return c.Conn.Write(p)
	}
	c.pending <- slices.Clone(p)
	return len(p), nil
}

// isScriptCall reports whether p, a command in RESP, calls a script on key.
func isScriptCall(p []byte, key string) bool {
	if !bytes.Contains(p, []byte("\r\n"+key+"\r\n")) {
		return false
	}
	p = bytes.ToLower(p)
	return bytes.Contains(p, []byte("\r\nevalsha\r\n")) || bytes.Contains(p, []byte("\r\neval\r\n"))
}

func (c *heldConn) flush(at time.Time) {
	time.Sleep(time.Until(at))
	for p := range c.pending {
		c.Conn.SetWriteDeadline(time.Time{}) // the client's has passed: the kernel would still send
		c.Conn.Write(p)
	}
	c.Conn.Close()
}

func (c *heldConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.pending != nil {
		close(c.pending) // flush closes the connection once written
		return nil
	}
	return c.Conn.Close()
}

// Tombstones are for requests that ended without an answer, not for the
// nodes an Acquire did not wait for: with node 2 20 ms away, every grant
// comes from nodes 0 and 1 before node 2 answers, and node 2's answer comes
// before the Release is sent there. Burying on every such Release would
// add two entries a handoff to node 2, each kept a TTL.
func TestHealthyPathBuriesNothing(t *testing.T) {
	addrs := testbed.Redises(t, 3)
	paths, proxies := redlocktest.Proxied(t, addrs)
	if err := proxies[2].Latency(20 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Node 2's requests (a dial, the handshake, the script: up to 120 ms)
	// well within the node timeout, even on a loaded machine.
	l := proxiedLocker(t, paths, redlock.Config{TTL: 4 * time.Second, NodeTimeout: time.Second})
	admin := redlocktest.Clients(t, addrs[2:])[0]
	const lock = "lock:{healthy}"
	for range 5 {
		lease, err := l.Acquire(t.Context(), "healthy")
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second) // node 2's acquires end, then its releases land
	gone, err := admin.ZRange(t.Context(), lock+":alive", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(gone) > 0 {
		t.Errorf("node 2 has %d tombstones after 5 healthy handoffs: %v", len(gone), gone)
	}
	if n, err := admin.Exists(t.Context(), lock).Result(); err != nil || n != 0 {
		t.Errorf("node 2 keeps the key after the releases (%v)", err)
	}
}
