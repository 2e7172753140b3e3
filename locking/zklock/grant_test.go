package zklock_test

import (
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/zklock"
)

// received is how many requests the server has received on the connection
// of session sid, from its cons four-letter word.
func received(t *testing.T, addr string, sid int64) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "cons")
	out, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(fmt.Sprintf(`recved=(\d+),sent=\d+,sid=0x%x[,)]`, sid)).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no connection of session 0x%x in cons:\n%s", sid, out)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// A turn on a free key costs the recipe's requests and no more: create,
// listing, delete. The token comes with the listing and the watch on our
// node waits for watchDelay, so a grant adds no request of its own (an
// ExistsW per grant would make it 4 per turn).
func TestGrantCostsNoRequest(t *testing.T) {
	servers := testbed.ZooKeeper(t)
	// A long session: no ping and no keepalive check during the turns.
	l, err := zklock.New(t.Context(), servers, zklock.Config{SessionTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	key := testbed.Prefix(t) + "/sku"
	turn := func() {
		lease, err := l.Acquire(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	turn() // makes the parent
	const n = 20
	before := received(t, servers[0], l.SessionID())
	for range n {
		turn()
	}
	// The cons request itself is on a connection of its own.
	got := received(t, servers[0], l.SessionID()) - before
	if got > 3*n+2 { // a ping or two, if the box stalls
		t.Errorf("%d turns cost %d requests, want 3 each (create, listing, delete)", n, got)
	}
	t.Logf("%d turns, %d requests", n, got)
}

// A node deleted behind the holder's back closes Lost within the watch's
// delay and a round trip, long before the keepalive's next check (every
// 2/9 of a 30 s session): at once after the grant (before the watch is
// set, unless the box stalls: then the watch finds the node gone) and
// once the watch is set (its event).
func TestDeletedNodeLost(t *testing.T) {
	servers := testbed.ZooKeeper(t)
	l, err := zklock.New(t.Context(), servers, zklock.Config{SessionTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var c *zk.Conn
	var events <-chan zk.Event
	if c, events, err = zk.Connect(servers, 5*time.Second, zk.WithLogInfo(false)); err != nil {
		t.Fatal(err)
	}
	defer func() {
		c.Close()
		for range events {
		}
	}()
	for _, after := range []time.Duration{0, 200 * time.Millisecond} {
		key := fmt.Sprintf("%s/sku-%v", testbed.Prefix(t), after)
		lease, err := l.Acquire(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(after)
		queue, err := children(c, key)
		if err != nil || len(queue) != 1 {
			t.Fatalf("queue %q, %v: want the holder's node alone", queue, err)
		}
		if err := c.Delete(parent(key)+"/"+queue[0], -1); err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		select {
		case <-lease.Lost():
			t.Logf("deleted %v after the grant: Lost after %v", after, time.Since(deleted))
		case <-time.After(3 * time.Second):
			t.Fatalf("deleted %v after the grant: Lost still open after 3 s", after)
		}
		lease.Release(t.Context())
	}
}
