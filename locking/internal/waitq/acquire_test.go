package waitq_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/internal/waitq"
)

const life = 3000 // ms a waiter stays live without a new try

// script runs the scripts of one lock key on a real Redis.
type script struct {
	t *testing.T
	c *redis.Client
	n waitq.Names
}

func newScript(t *testing.T) script {
	c := redis.NewClient(&redis.Options{Addr: testbed.Redis(t)})
	t.Cleanup(func() { c.Close() })
	return script{t: t, c: c, n: waitq.NamesOf(testbed.Prefix(t)+":", "k")}
}

// acquire tries for member with place ("" = the server's time) and
// returns whether it was granted.
func (s script) acquire(member, place string) bool {
	s.t.Helper()
	res, err := waitq.Default.Acquire.Run(context.Background(), s.c, []string{s.n.Lock, s.n.Queue, s.n.Alive},
		"owner-"+member, 60000, member, life, place, s.n.Wake, "").Slice()
	if err != nil {
		s.t.Fatalf("acquire script for %s: %v", member, err)
	}
	return res[0] == int64(1)
}

func (s script) release(member string) {
	s.t.Helper()
	if err := waitq.Default.Release.Run(context.Background(), s.c, []string{s.n.Lock, s.n.Queue, s.n.Alive},
		"owner-"+member, s.n.Wake, "", "1").Err(); err != nil {
		s.t.Fatal(err)
	}
}

// nowMicros is the server's time in µs.
func (s script) nowMicros() int64 {
	s.t.Helper()
	now, err := s.c.Time(context.Background()).Result()
	if err != nil {
		s.t.Fatal(err)
	}
	return now.UnixMicro()
}

// A caller whose place makes it first in the queue of a free lock takes the
// lock in that call (the old script chose the head
// before queueing the caller, refused it, and nobody woke it: the lock
// stayed idle until its fallback timer).
func TestEarlierPlaceTakesFreeLock(t *testing.T) {
	s := newScript(t)
	if !s.acquire("h", "") {
		t.Fatal("h: a free lock was refused")
	}
	if s.acquire("x", "") {
		t.Fatal("x: granted while h holds")
	}
	s.release("h") // wakes x, which keeps its place during its round trip
	early := strconv.FormatInt(s.nowMicros()-time.Second.Microseconds(), 10)
	if !s.acquire("y", early) {
		t.Fatal("y, whose place is before x's, was refused a free lock: it is first in the queue and nobody will wake it")
	}
	if s.acquire("x", "") {
		t.Fatal("x granted while y holds")
	}
}

// A place a client chose is clamped to [now - life, now] of the server's
// clock: a client clock an hour ahead cannot put its waiter behind every
// later arrival, nor one an hour behind ahead of them all.
func TestClientPlaceClamped(t *testing.T) {
	s := newScript(t)
	if !s.acquire("h", "") {
		t.Fatal("h: a free lock was refused")
	}
	now := s.nowMicros()
	hour := time.Hour.Microseconds()
	s.acquire("ahead", strconv.FormatInt(now+hour, 10))
	s.acquire("behind", strconv.FormatInt(now-hour, 10))
	after := s.nowMicros()
	near := now + life*1000/2 // inside the window: kept as sent, the same on every node
	s.acquire("near", strconv.FormatInt(near, 10))
	for member, bounds := range map[string][2]int64{"ahead": {now + life*1000, after + life*1000}, "behind": {now - 10*life*1000, after - 10*life*1000}, "near": {near, near}} {
		place, err := s.c.ZScore(context.Background(), s.n.Queue, member).Result()
		if err != nil {
			t.Fatal(err)
		}
		if int64(place) < bounds[0] || int64(place) > bounds[1] {
			t.Errorf("%s: queued at %d µs, want within [%d, %d] (kept within [now - 10 life, now + life], clamped outside)", member, int64(place), bounds[0], bounds[1])
		}
	}
}

// A queued member without liveness (the two sets diverged) is dropped, not
// an error in the middle of the script.
func TestQueueWithoutLiveness(t *testing.T) {
	s := newScript(t)
	if err := s.c.ZAdd(context.Background(), s.n.Queue, redis.Z{Score: 1, Member: "ghost"}).Err(); err != nil {
		t.Fatal(err)
	}
	if s.acquire("x", "") {
		t.Fatal("x granted while a (dead) waiter heads the queue")
	}
	if s.c.ZScore(context.Background(), s.n.Queue, "ghost").Err() != redis.Nil {
		t.Error("the member without liveness is still queued")
	}
	if !s.acquire("x", "") {
		t.Error("x refused once the dead waiter is gone")
	}
}

// Keys with braces would break the hash tag that keeps a lock's keys in one
// Cluster slot.
func TestCheckKey(t *testing.T) {
	for key, ok := range map[string]bool{"sku/A-1": true, "": false, "}x": false, "a{b}": false, "{": false} {
		if err := waitq.CheckKey(key); (err == nil) != ok {
			t.Errorf("CheckKey(%q) = %v, want ok=%v", key, err, ok)
		}
	}
}
