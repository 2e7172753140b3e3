package redislock_test

import (
	"testing"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/redislock"
)

// TestIdentity: locktest.Identity on a Redis that persists every write,
// and a Redis that lost its data (FLUSHALL, as a restart without
// persistence leaves it) gives a new identity: its counters start again
// from 1, below the fences.
func TestIdentity(t *testing.T) {
	t.Parallel()
	persist := testbed.Options{Args: []string{"--appendonly", "yes", "--appendfsync", "always"}}
	open := func(t *testing.T, addr string) locking.Locker { return newLocker(t, addr, redislock.Config{}) }
	srv, id := locktest.Identity(t, testbed.StartRedis, persist, open)
	c, err := redisconn.Open(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, srv.Addr, redislock.Config{})
	if got, err := locktest.IdentityOf(t, l); err != nil || got == "" || got == id {
		t.Errorf("identity after FLUSHALL: %q, %v; want one other than %q", got, err, id)
	}
}
