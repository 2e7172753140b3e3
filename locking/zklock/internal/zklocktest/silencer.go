package zklocktest

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Silencer dials ZooKeeper (its Dial is a zklock.Config.Dialer); Cut makes
// the connections open so far silent both ways (writes vanish, nothing is
// read: the server hears no ping and expires the session) and refuses new
// dials until Restore.
type Silencer struct {
	mu     sync.Mutex
	conns  []*silentConn
	refuse bool
}

func (s *Silencer) Dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuse {
		return nil, errors.New("dial refused by the test")
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	sc := &silentConn{Conn: c}
	s.conns = append(s.conns, sc)
	return sc, nil
}

func (s *Silencer) Cut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = true
	for _, c := range s.conns {
		c.silent.Store(true)
	}
}

func (s *Silencer) Restore() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = false
}

type silentConn struct {
	net.Conn
	silent atomic.Bool
}

func (c *silentConn) Write(p []byte) (int, error) {
	if c.silent.Load() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *silentConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if err != nil || !c.silent.Load() {
			return n, err
		}
	}
}
