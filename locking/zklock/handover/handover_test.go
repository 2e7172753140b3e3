package handover_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/zklock"
	"github.com/oversold-lab/oversold/locking/zklock/handover"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// An Acquire whose ctx ends while its goroutine is being granted the lock
// leaves nothing held: the grant nobody took is released. Each
// try cancels after a delay around a free key's acquire time, so some
// grants land just as the caller gives up; a lease left unreleased would
// hold its key for the session's life and the rival would wait for it.
func TestGrantAsCallerGivesUpIsReleased(t *testing.T) {
	servers := testbed.ZooKeeper(t)
	open := func() *handover.Locker {
		l, err := zklock.New(t.Context(), servers, zklock.Config{SessionTimeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		h := handover.New(l)
		t.Cleanup(func() { h.Close() })
		return h
	}
	l, rival := open(), open()
	cancelled := 0
	for i := range 60 {
		key := fmt.Sprintf("%s/sku-%d", testbed.Prefix(t), i)
		ctx, cancel := context.WithTimeout(t.Context(), time.Duration(i%20)*time.Millisecond)
		lease, err := l.Acquire(ctx, key)
		cancel()
		if err == nil {
			lease.Release(t.Context())
		} else if errors.Is(err, context.DeadlineExceeded) {
			cancelled++
		}
		rctx, rcancel := context.WithTimeout(t.Context(), 5*time.Second)
		got, err := rival.Acquire(rctx, key)
		rcancel()
		if err != nil {
			t.Fatalf("try %d (%v to give up): the rival: %v", i, time.Duration(i%20)*time.Millisecond, err)
		}
		got.Release(t.Context())
	}
	t.Logf("%d of 60 Acquires gave up", cancelled)
}
