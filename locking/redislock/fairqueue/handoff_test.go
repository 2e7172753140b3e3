package fairqueue_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/internal/waitq"
	"github.com/oversold-lab/oversold/locking/redislock"
)

// Direct handoff: a release hands the lock to the first live waiter (the
// key set to its owner, the fence counted, the token in its wake-up). These
// tests put a waiter in the queue the way a Locker's try does, with the
// acquire script, but nobody hears its channel: a process that died after
// its last try, or a wake-up that was lost.

// handoffSetup is a Locker holding key, and a raw waiter queued behind it.
type handoffSetup struct {
	admin         *redis.Client
	n             waitq.Names
	ttl           time.Duration
	holder        locking.Lease
	owner, member string // the raw waiter's
}

func newHandoff(t *testing.T, ctx context.Context, addr, key string, ttl time.Duration) *handoffSetup {
	t.Helper()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	a := newLocker(t, addr, redislock.Config{TTL: ttl})
	holder, err := a.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	s := &handoffSetup{admin: admin, n: waitq.NamesOf("lock:", key), ttl: ttl, holder: holder, owner: waitq.NewOwner()}
	s.member = waitq.HandoffMember("0123456789abcdef", s.owner, ttl) // a Locker id nobody listens for
	if granted, _ := s.try(t, ctx); granted {
		t.Fatal("the raw waiter was granted a held lock")
	}
	return s
}

// try runs the raw waiter's try, as redislock's try does (a minute of life).
func (s *handoffSetup) try(t *testing.T, ctx context.Context) (granted bool, n int64) {
	t.Helper()
	res, err := waitq.Default.Acquire.Run(ctx, s.admin, []string{s.n.Lock, s.n.Queue, s.n.Alive, s.n.Fence},
		s.owner, s.ttl.Milliseconds(), s.member, 60000, "", s.n.Wake, "", "", "g").Slice()
	if err != nil {
		t.Fatal(err)
	}
	return res[0].(int64) == 1, res[1].(int64)
}

func (s *handoffSetup) fence(t *testing.T, ctx context.Context) uint64 {
	t.Helper()
	v, err := s.admin.Get(ctx, s.n.Fence).Uint64()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitQueued waits until n waiters are queued on the key.
func (s *handoffSetup) waitQueued(t *testing.T, ctx context.Context, n int64) {
	t.Helper()
	waitQueued(t, ctx, s.admin, s.n, n)
}

// waitQueued waits until n waiters are queued on the lock named n.
func waitQueued(t *testing.T, ctx context.Context, admin *redis.Client, names waitq.Names, n int64) {
	t.Helper()
	for {
		q, err := admin.ZCard(ctx, names.Queue).Result()
		if err != nil {
			t.Fatal(err)
		}
		if q == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d waiters queued, want %d", q, n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitListening waits until the head of the lock's queue (a Locker's
// waiter) listens for its wake-ups and has tried again since (it retries
// once its subscription is confirmed): a release from then on hands it the
// lock by message, not through its next try. It returns the head's member.
func waitListening(t *testing.T, ctx context.Context, admin *redis.Client, names waitq.Names) string {
	t.Helper()
	waitQueued(t, ctx, admin, names, 1)
	member := admin.ZRange(ctx, names.Queue, 0, 0).Val()[0]
	id, _, _ := strings.Cut(member, ":")
	first := admin.ZScore(ctx, names.Alive, member).Val()
	for admin.PubSubNumSub(ctx, names.Wake+id).Val()[names.Wake+id] == 0 || admin.ZScore(ctx, names.Alive, member).Val() == first {
		select {
		case <-ctx.Done():
			t.Fatalf("the waiter %s does not listen for its wake-ups", member)
		case <-time.After(2 * time.Millisecond):
		}
	}
	return member
}

// release hands the lock to the raw waiter and checks that it did: the key
// holds the waiter's owner, the counter moved on by one.
func (s *handoffSetup) release(t *testing.T, ctx context.Context) (token uint64) {
	t.Helper()
	if err := s.holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := s.admin.Get(ctx, s.n.Lock).Result(); err != nil || got != s.owner {
		t.Fatalf("after the release the key holds %q (%v), want the first waiter's owner %q", got, err, s.owner)
	}
	token = s.fence(t, ctx)
	if token != s.holder.Token()+1 {
		t.Fatalf("fence counter %d after the handoff, want %d", token, s.holder.Token()+1)
	}
	return token
}

// acquireAsync starts an Acquire of key on l and returns its outcome.
func acquireAsync(ctx context.Context, l *redislock.Locker, key string) <-chan locking.Lease {
	out := make(chan locking.Lease, 1)
	go func() {
		lease, err := l.Acquire(ctx, key)
		if err != nil {
			lease = nil
		}
		out <- lease
	}()
	return out
}

// A lock handed to a waiter whose wake-up was lost is still that waiter's:
// nobody else takes it, and the waiter's next try finds its own owner in
// the key and gets the lock with the token of the handoff, its TTL renewed.
func TestHandoffMessageLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	addr := testbed.Redis(t)
	s := newHandoff(t, ctx, addr, "lost-grant", 5*time.Second)
	token := s.release(t, ctx)

	other := newLocker(t, addr, redislock.Config{TTL: 5 * time.Second})
	tctx, tcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer tcancel()
	if lease, err := other.Acquire(tctx, "lost-grant"); err == nil {
		t.Fatalf("another Locker took the lock handed to the waiter (token %d)", lease.Token())
	}
	if err := s.admin.PExpire(ctx, s.n.Lock, time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	granted, got := s.try(t, ctx)
	if !granted || uint64(got) != token {
		t.Fatalf("the waiter's next try: granted %v, token %d; want the handed lock, token %d", granted, got, token)
	}
	if pttl := s.admin.PTTL(ctx, s.n.Lock).Val(); pttl < 4*time.Second {
		t.Errorf("the try left the handed key %v to live, want its TTL renewed (5s)", pttl)
	}
	if q := s.admin.ZCard(ctx, s.n.Queue).Val(); q != 0 {
		t.Errorf("%d waiters queued after the handoff, want 0 (the holder is not queued again)", q)
	}
}

// A lock handed to a waiter that died or stopped after its last try (its
// place still live) blocks the key only for the waiter's handoff PX,
// bounded by its place's life (queueLife, 2 s by default), not for its TTL
// (10 s here before); then the next waiter gets it, with a
// greater token. The dead waiter is a real Locker whose connections (its
// tries and its subscription) are cut.
func TestHandoffToDeadWaiter(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	addr := testbed.Redis(t)
	const ttl = 10 * time.Second
	life := 2 * (time.Second + 5*time.Millisecond) // the default backoffs' queueLife
	proxy, err := testbed.StartProxy("redis", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	n := waitq.NamesOf("lock:", "dead-waiter")
	holder, err := newLocker(t, addr, redislock.Config{TTL: ttl}).Acquire(ctx, "dead-waiter")
	if err != nil {
		t.Fatal(err)
	}
	acquireAsync(ctx, newLocker(t, proxy.Addr(), redislock.Config{TTL: ttl}), "dead-waiter")
	waitQueued(t, ctx, admin, n, 1)
	head := admin.ZRange(ctx, n.Queue, 0, 0).Val()[0]
	next := acquireAsync(ctx, newLocker(t, addr, redislock.Config{TTL: ttl}), "dead-waiter")
	waitQueued(t, ctx, admin, n, 2)
	if err := proxy.Cut(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := admin.Get(ctx, n.Lock).Val(); got == "" || !strings.Contains(head, ":"+got+":") {
		t.Fatalf("after the release the key holds %q, want the dead waiter's owner (member %s)", got, head)
	}
	if pttl := admin.PTTL(ctx, n.Lock).Val(); pttl > life {
		t.Errorf("the key handed to the dead waiter lives %v, more than its place would (%v)", pttl, life)
	}
	select {
	case lease := <-next:
		waited := time.Since(start)
		if lease == nil {
			t.Fatal("the next waiter's Acquire failed")
		}
		defer lease.Release(ctx)
		// About life (2.01-2.12 s measured at load 20-30); a key that
		// lives for the TTL frees at 10 s: half the TTL parts them.
		if waited > ttl/2 {
			t.Errorf("the next waiter got the lock %v after the handoff to the dead waiter, want about its queue life (%v), well before the TTL (%v)", waited, life, ttl)
		}
		if lease.Token() != holder.Token()+2 {
			t.Errorf("the next waiter's token is %d, want %d (the dead waiter's was %d)", lease.Token(), holder.Token()+2, holder.Token()+1)
		}
		t.Logf("the next waiter got the lock %v after the handoff to the dead waiter (TTL %v, queue life %v)", waited, ttl, life)
	case <-time.After(ttl + 5*time.Second):
		t.Fatalf("the next waiter was not granted within %v of the handoff to a dead waiter", ttl+5*time.Second)
	}
}

// A waiter that gives up after it was handed the lock (its ctx ended, its
// Locker closed) releases it in the same script that takes it out of the
// queue, and the lock goes on to the next waiter at once, not at the TTL.
func TestHandoffToWaiterThatGaveUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	addr := testbed.Redis(t)
	const ttl = 10 * time.Second
	s := newHandoff(t, ctx, addr, "gave-up", ttl)
	next := acquireAsync(ctx, newLocker(t, addr, redislock.Config{TTL: ttl}), "gave-up")
	s.waitQueued(t, ctx, 2)
	token := s.release(t, ctx)
	// The waiter's undo, as redislock's release does it.
	start := time.Now()
	released, err := waitq.Default.Release.Run(ctx, s.admin, []string{s.n.Lock, s.n.Queue, s.n.Alive, s.n.Fence},
		s.owner, s.n.Wake, s.member, "g", "").Bool()
	if err != nil || !released {
		t.Fatalf("the waiter's undo released %v (%v), want the handed lock released", released, err)
	}
	select {
	case lease := <-next:
		if lease == nil {
			t.Fatal("the next waiter's Acquire failed")
		}
		if lease.Token() != token+1 {
			t.Errorf("the next waiter's token is %d, want %d", lease.Token(), token+1)
		}
		t.Logf("the next waiter got the lock %v after the undo", time.Since(start))
		lease.Release(ctx)
	case <-time.After(ttl / 2):
		t.Fatalf("the next waiter was not granted within %v of the undo (the lock waited for its TTL)", ttl/2)
	}
}
