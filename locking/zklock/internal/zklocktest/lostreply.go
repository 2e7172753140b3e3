package zklocktest

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/zklock"
)

// LostCreateReply is the lost-reply test on the ZooKeeper servers given,
// for a Locker whose queue node create makes (nil = zklock.CreateOnce):
// the reply to the first create that succeeds never arrives (the
// connection breaks in its place). Acquire must take the key on the node
// that create made, with no second one queued, and its Release must leave
// the queue empty: a node of ours that nobody deletes sits, kept alive by
// our own session, ahead of every later Acquire of the key.
func LostCreateReply(t *testing.T, servers []string, create zklock.CreateFunc) {
	var arm, dropped atomic.Bool
	dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return &dropCreateReply{Conn: c, arm: &arm, dropped: &dropped}, nil
	}
	l, err := zklock.New(t.Context(), servers, zklock.Config{SessionTimeout: TTL, Dialer: dial, Create: create})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	key := testbed.Prefix(t) + "/sku"
	arm.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, key) // an orphan would sit ahead of us forever
	if err != nil {
		t.Fatal(err)
	}
	if !dropped.Load() {
		t.Fatal("the create reply was not dropped: the test proves nothing")
	}
	count := func() int {
		var queue []string
		if err := WithConn(t.Context(), servers, func(c *zk.Conn) (err error) {
			queue, err = Children(c, key)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return len(queue)
	}
	if n := count(); n != 1 {
		t.Errorf("%d nodes queued for the key after one acquire whose create reply was lost", n)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Errorf("%d nodes left after release", n)
	}
}

// dropCreateReply passes ZooKeeper traffic through, except that once armed
// it breaks the connection in place of delivering the reply to the next
// create request that succeeds. go-zookeeper writes one whole packet per
// Write.
type dropCreateReply struct {
	net.Conn
	arm, dropped *atomic.Bool
	target       atomic.Int32 // xid of the create whose reply to drop
	pending      []byte       // the rest of the packet being read
}

const opCreate = 1

func (c *dropCreateReply) Write(p []byte) (int, error) {
	if len(p) >= 12 {
		xid, op := int32(binary.BigEndian.Uint32(p[4:])), int32(binary.BigEndian.Uint32(p[8:]))
		if xid > 0 && op == opCreate && c.arm.CompareAndSwap(true, false) {
			c.target.Store(xid)
		}
	}
	return c.Conn.Write(p)
}

func (c *dropCreateReply) Read(p []byte) (int, error) {
	if len(c.pending) == 0 {
		var size [4]byte
		if _, err := io.ReadFull(c.Conn, size[:]); err != nil {
			return 0, err
		}
		packet := make([]byte, 4+binary.BigEndian.Uint32(size[:]))
		copy(packet, size[:])
		if _, err := io.ReadFull(c.Conn, packet[4:]); err != nil {
			return 0, err
		}
		// A reply is xid, zxid, error code: drop the create's, if it succeeded.
		if xid := c.target.Load(); xid != 0 && len(packet) >= 20 && int32(binary.BigEndian.Uint32(packet[4:])) == xid {
			if binary.BigEndian.Uint32(packet[16:]) != 0 {
				c.arm.Store(true) // failed (no parent yet): wait for the retry
			} else {
				c.dropped.Store(true)
				c.Conn.Close()
				return 0, errors.New("create reply dropped")
			}
		}
		c.pending = packet
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}
