package fairqueue_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/internal/waitq"
	"github.com/oversold-lab/oversold/locking/redislock"
)

// A waiter trusts a grant message (direct handoff) only if its token
// exceeds the fence counter its last try saw, and only if it hears it
// within px/3 of that try; otherwise it confirms by a try. These tests
// publish grants to a real waiting Locker while the key is another
// holder's: a waiter that trusts any grant fails both, one
// without the fence check fails the stale one, one without the time check
// the late one. Each ends with a grant that passes both checks, which the
// waiter must take: the refusals are the checks', not a grant never heard.

// grantSetup is a Locker A holding key and a Locker B waiting for it,
// with a handoff PX of 600 ms (its TTL) and tries at least a second apart
// (MinBackoff = MaxBackoff = 2 s: the fallback wait is 1 to 2 s).
type grantSetup struct {
	admin   *redis.Client
	n       waitq.Names
	held    locking.Lease
	got     <-chan locking.Lease
	member  string // B's
	channel string // B's wake-up channel
	px      string // B's handoff PX, in ms
}

func newGrantSetup(t *testing.T, ctx context.Context, key string) *grantSetup {
	t.Helper()
	addr := testbed.Redis(t)
	s := &grantSetup{admin: redis.NewClient(&redis.Options{Addr: addr}), n: waitq.NamesOf("lock:", key)}
	t.Cleanup(func() { s.admin.Close() })
	var err error
	if s.held, err = newLocker(t, addr, redislock.Config{TTL: 10 * time.Second}).Acquire(ctx, key); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.held.Release(context.Background()) })
	b := newLocker(t, addr, redislock.Config{TTL: 600 * time.Millisecond, MinBackoff: 2 * time.Second, MaxBackoff: 2 * time.Second})
	s.got = acquireAsync(ctx, b, key)
	s.member = waitListening(t, ctx, s.admin, s.n)
	id, _, _ := strings.Cut(s.member, ":")
	s.channel = s.n.Wake + id
	s.px = s.member[strings.LastIndex(s.member, ":")+1:]
	if s.px != "600" {
		t.Fatalf("B's member %s: want a handoff PX of 600 ms", s.member)
	}
	return s
}

// nextTry waits for B's next try (its liveness deadline moves) and returns
// the new deadline.
func (s *grantSetup) nextTry(t *testing.T, ctx context.Context) float64 {
	t.Helper()
	last := s.admin.ZScore(ctx, s.n.Alive, s.member).Val()
	for {
		if d := s.admin.ZScore(ctx, s.n.Alive, s.member).Val(); d != last {
			return d
		}
		select {
		case <-ctx.Done():
			t.Fatal("B made no new try")
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// publish sends B a grant of token, as release.lua's handoff does, if B
// has not tried again since the try whose liveness deadline is alive.
func (s *grantSetup) publish(t *testing.T, ctx context.Context, alive float64, token uint64) {
	t.Helper()
	if d := s.admin.ZScore(ctx, s.n.Alive, s.member).Val(); d != alive {
		t.Fatal("B tried again before the grant was sent (the machine is too slow for this test's timing)")
	}
	if err := s.admin.Publish(ctx, s.channel, s.member+" "+strconv.FormatUint(token, 10)+" "+s.px).Err(); err != nil {
		t.Fatal(err)
	}
}

// refused checks that B holds nothing for a while and is still queued.
func (s *grantSetup) refused(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	select {
	case lease := <-s.got:
		if lease != nil {
			t.Fatalf("B took %s: it holds token %d while A holds %d", what, lease.Token(), s.held.Token())
		}
		t.Fatal("B's Acquire failed")
	case <-time.After(300 * time.Millisecond):
	}
	if err := s.admin.ZScore(ctx, s.n.Queue, s.member).Err(); err != nil {
		t.Fatalf("B is not queued after it refused %s: %v", what, err)
	}
}

// accepts checks that a grant sent right after a try, above the fence, is
// taken.
func (s *grantSetup) accepts(t *testing.T, ctx context.Context) {
	t.Helper()
	alive := s.nextTry(t, ctx)
	s.publish(t, ctx, alive, s.held.Token()+1)
	select {
	case lease := <-s.got:
		if lease == nil || lease.Token() != s.held.Token()+1 {
			t.Fatalf("B took a timely grant above the fence as %v, want token %d", lease, s.held.Token()+1)
		}
		lease.Release(ctx) // not held (the key is A's): ErrNotHeld
	case <-time.After(time.Second):
		t.Fatal("B did not take a timely grant above the fence: the harness cannot show a refusal")
	}
}

// A grant whose token does not exceed the fence counter B's last try saw
// (a message from before that try, or from before a counter reset) is not
// B's lock, however soon after the try it comes.
func TestHandoffStaleGrantRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s := newGrantSetup(t, ctx, "stale-grant")
	alive := s.nextTry(t, ctx)
	s.publish(t, ctx, alive, s.held.Token())
	s.refused(t, ctx, "a grant of the fence's own token")
	alive = s.nextTry(t, ctx)
	s.publish(t, ctx, alive, s.held.Token()-1)
	s.refused(t, ctx, "a grant below the fence")
	s.accepts(t, ctx)
}

// A grant above the fence heard px/3 or more after B's last try (a message
// delayed, or a waiter slow to read it) is confirmed by a try, which finds
// the key A's: B stays queued.
func TestHandoffLateGrantConfirmed(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s := newGrantSetup(t, ctx, "late-grant")
	alive := s.nextTry(t, ctx)
	time.Sleep(300 * time.Millisecond) // px/3 is 200 ms; B's next try is 1 s or more away
	s.publish(t, ctx, alive, s.held.Token()+1)
	s.refused(t, ctx, "a grant heard 300 ms after its last try")
	s.accepts(t, ctx)
}
