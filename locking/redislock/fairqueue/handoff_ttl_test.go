package fairqueue_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/internal/waitq"
	"github.com/oversold-lab/oversold/locking/redislock"
)

// Lockers with different TTLs share a server (a rolling config change): a
// lock handed by a releaser with a short TTL to a waiter with a long one
// must live on the server for as long as the waiter trusts it. No third
// Locker may take the key while the waiter's Lost is open (before, the
// handed key lived for the releaser's 600 ms, the waiter trusted its
// own 10 s).
func TestHandoffTTLMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	addr := testbed.Redis(t)
	const short = 600 * time.Millisecond
	a := newLocker(t, addr, redislock.Config{TTL: short})
	b := newLocker(t, addr, redislock.Config{TTL: 10 * time.Second})
	c := newLocker(t, addr, redislock.Config{TTL: 10 * time.Second})
	held, err := a.Acquire(ctx, "ttl-mix")
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, b, "ttl-mix")
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	n := waitq.NamesOf("lock:", "ttl-mix")
	member := waitListening(t, ctx, admin, n)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := admin.Get(ctx, n.Lock).Val(); got == "" || !strings.Contains(member, ":"+got+":") {
		t.Fatalf("after the release the key holds %q, want the waiter's owner (member %s)", got, member)
	}
	var lease interface {
		Token() uint64
		Lost() <-chan struct{}
	}
	select {
	case l := <-got:
		if l == nil {
			t.Fatal("the waiter's Acquire failed")
		}
		lease = l
		defer l.Release(ctx)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not handed the lock")
	}
	// Past the releaser's TTL, and past the first renewal of a handed
	// lease (it lives min(TTL, the waiter's queue life) until then).
	cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
	defer ccancel()
	third, err := c.Acquire(cctx, "ttl-mix")
	if err != nil {
		t.Logf("the third Locker waited %v in vain while the waiter (token %d) held", 3*time.Second, lease.Token())
		return
	}
	defer third.Release(ctx)
	select {
	case <-lease.Lost():
	default:
		t.Fatalf("two holders: the third Locker was granted token %d while the waiter (token %d) still holds (Lost open)", third.Token(), lease.Token())
	}
}
