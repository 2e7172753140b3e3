package waitq_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/locking/internal/waitq"
)

// A Redlock undo or leave can reach a node before the acquire request it
// ends, when the two travel on different connections. With
// 't' the release buries the owner and the member for the TTL, and a late
// acquire of either is refused without taking the key or a place; others
// are not, and the tombstone lapses with the TTL.
func TestBuriedAcquireRefused(t *testing.T) {
	s := newScript(t)
	ctx := context.Background()
	const ttl = 300 // ms
	keys := []string{s.n.Lock, s.n.Queue, s.n.Alive}
	acquire := func(owner, member string) bool {
		t.Helper()
		res, err := waitq.Default.Acquire.Run(ctx, s.c, keys, owner, 60000, member, life, "", s.n.Wake, "keep", "", "", "t").Slice()
		if err != nil {
			t.Fatal(err)
		}
		return res[0] == int64(1)
	}
	// The undo of one attempt (owner only), the leave of a wait (owner and
	// member), each before its acquire arrived.
	for _, c := range []struct{ owner, member string }{{"attempt", ""}, {"last-attempt", "loc:waiter"}} {
		if err := waitq.Default.Release.Run(ctx, s.c, keys, c.owner, s.n.Wake, c.member, "1", "", ttl, "t").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if acquire("attempt", "loc:other") {
		t.Error("an undone attempt's late acquire took the lock")
	}
	if acquire("other", "loc:waiter") {
		t.Error("a departed waiter's late acquire took the lock")
	}
	if n, err := s.c.Exists(ctx, s.n.Lock).Result(); err != nil || n != 0 {
		t.Errorf("lock key present after the refused late acquires (%v)", err)
	}
	if _, err := s.c.ZScore(ctx, s.n.Queue, "loc:waiter").Result(); err != redis.Nil {
		t.Errorf("the departed waiter is queued again (%v)", err)
	}
	if !acquire("newcomer", "loc:newcomer") {
		t.Fatal("a newcomer was refused: the tombstones block others")
	}
	if err := waitq.Default.Release.Run(ctx, s.c, keys, "newcomer", s.n.Wake, "loc:newcomer", "1").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * ttl * time.Millisecond)
	if !acquire("attempt", "loc:other") {
		t.Error("the tombstone outlived its TTL")
	}
}
