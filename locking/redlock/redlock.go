// Package redlock is the Redlock algorithm over N >= 3 independent Redis
// masters: a lock is held while a majority of the nodes hold its key.
//
// Acquire sends SET lock owner NX PX ttl (a random owner per attempt) to
// every node at once, each request bounded by a per-node timeout small next
// to the TTL. The lock is granted when a majority said yes and time is
// left: validity = TTL - elapsed - drift (keepalive.Drift), measured from
// the moment the requests were sent. Otherwise the attempt deletes its key
// from every node that did not refuse, in the background on a fresh context
// (a node may have set the key and lost the reply), waits, and tries again;
// a wait that ctx ends removes what it took the same way. A watchdog
// (keepalive) renews every TTL/3 with an owner-checked PEXPIRE; a renewal
// counts only when a majority confirms it within the current validity, and
// Lost closes when the validity runs out. Release deletes the key, owner
// checked, on every node.
//
// Token is always 0: Redlock has no safe fencing token (counters on several
// nodes drift apart, and a restarted node can make a second majority).
// Guard writes in storage, or use a lock with a real token.
//
// Two small interfaces let the hardening plug in without this package
// knowing it: Fanout (when a request has heard enough; quorum returns on a
// majority's answer) and Queue (how a waiter waits; fairwake queues it on
// every node and wakes it with the release). locking/backends composes them.
// Sources, failure modes and the reasoning: docs/locks/redlock.md.
package redlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/keepalive"
)

var _ locking.Locker = (*Locker)(nil)

// ErrClosed is returned by Acquire on a closed Locker.
var ErrClosed = errors.New("redlock: locker closed")

// maxUnreachable is how many attempts in a row without answers from a
// majority make Acquire give up with locking.ErrUnavailable.
const maxUnreachable = 3

// Config tunes a Locker. The zero value is usable.
type Config struct {
	// TTL is the lease time to live, renewed every TTL/3. 0 = 10s.
	TTL time.Duration
	// Prefix starts every Redis key of the Locker. "" = "lock:".
	Prefix string
	// NodeTimeout bounds one request to one node, so that a dead node
	// cannot eat the validity. 0 = TTL/20, at most 100ms.
	NodeTimeout time.Duration
	// MinBackoff and MaxBackoff bound the random delays between tries
	// (that no wake-up cut short, with a Queue that wakes). 0 = 5ms and 1s.
	MinBackoff, MaxBackoff time.Duration
	// OnRenewalFailed, if set, hears every failed renewal (for metrics).
	OnRenewalFailed func(key string, err error)
	// Fanout and Queue plug in the hardening; nil = WaitAll and Sleep.
	Fanout Fanout
	Queue  Queue
}

func (c Config) withDefaults() Config {
	if c.TTL <= 0 {
		c.TTL = 10 * time.Second
	}
	if c.Prefix == "" {
		c.Prefix = "lock:"
	}
	if c.NodeTimeout <= 0 {
		c.NodeTimeout = min(c.TTL/20, 100*time.Millisecond)
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 5 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = time.Second
	}
	c.MaxBackoff = max(c.MaxBackoff, c.MinBackoff)
	if c.Fanout == nil {
		c.Fanout = WaitAll{}
	}
	if c.Queue == nil {
		c.Queue = Sleep{}
	}
	return c
}

// Locker grants leases held on a majority of independent Redis masters. It
// is safe for concurrent use.
type Locker struct {
	nodes  []redis.UniversalClient
	quorum int
	cfg    Config

	mu      sync.Mutex
	leases  map[*lease]struct{} // live leases, ended by Close
	closed  bool
	closing chan struct{}
	// Requests still under way after their caller returned end at their
	// timeout, or once stop is cancelled by Close.
	stop   context.Context
	cancel context.CancelFunc
}

// New returns a Locker on the given independent masters (not replicas of
// each other, not one Cluster: Redlock's votes must fail independently).
// Close does not close the clients.
func New(clients []redis.UniversalClient, cfg Config) (*Locker, error) {
	if len(clients) < 3 {
		return nil, fmt.Errorf("redlock: %d nodes given, want at least 3 independent masters", len(clients))
	}
	l := &Locker{nodes: clients, quorum: len(clients)/2 + 1, cfg: cfg.withDefaults(),
		leases: make(map[*lease]struct{}), closing: make(chan struct{})}
	l.stop, l.cancel = context.WithCancel(context.Background())
	return l, nil
}

// ask sends r to every node through the Fanout.
func (l *Locker) ask(r Request) Tally {
	votes, _ := l.cfg.Fanout.Ask(l.request(r))
	return Count(votes)
}

func (l *Locker) request(r Request) Request {
	r.n, r.stop = len(l.nodes), l.stop
	return r
}

// Ping checks that a majority of the nodes answer: Redlock works with a
// minority down.
func (l *Locker) Ping(ctx context.Context) error {
	t := l.ask(Request{Ctx: ctx, Base: ctx, Timeout: l.cfg.TTL, Decided: l.confirmed, Do: func(ctx context.Context, i int) Vote {
		return Vote{Yes: true, Err: l.nodes[i].Ping(ctx).Err()}
	}})
	if t.Yes < l.quorum {
		return fmt.Errorf("ping: %d of %d nodes answer, want %d: %w", t.Yes, len(l.nodes), l.quorum, t.Errs)
	}
	return nil
}

// confirmed: a majority said yes, or too many said no for one to.
func (l *Locker) confirmed(t Tally) bool {
	return t.Yes >= l.quorum || t.No > len(l.nodes)-l.quorum
}

// decides: a majority said yes, or too many refused or failed for one to.
func (l *Locker) decides(t Tally) bool {
	return t.Yes >= l.quorum || t.No+t.Failed > len(l.nodes)-l.quorum
}

// Acquire waits until a majority of the nodes grant the lock on key, ctx
// ends, or too many nodes fail.
func (l *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	a := &attempts{l: l, key: key, w: l.cfg.Queue.Join(key, l.cfg, l.closing),
		sent: make([]<-chan struct{}, len(l.nodes)), unanswered: make([]atomic.Bool, len(l.nodes))}
	granted := false
	defer func() {
		if !granted && a.w.Queued() {
			a.end(ctx, nil)
		}
		a.w.Stop(granted)
	}()
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("acquire %q: %w", key, err)
		}
		sent := time.Now()
		ok, t, votes, elapsed := a.try(ctx, sent)
		if ok {
			granted = true
			return l.grant(ctx, a, sent)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("acquire %q: %w", key, ctx.Err())
		}
		if t.Failed <= len(l.nodes)-l.quorum {
			a.unreachable = 0 // a majority answered, or may yet
		} else if a.unreachable++; a.unreachable >= maxUnreachable || t.Down > len(l.nodes)-l.quorum {
			return nil, fmt.Errorf("acquire %q: %w: no majority of nodes answers: %w", key, locking.ErrUnavailable, t.Errs)
		}
		if err := a.w.Next(ctx, attempt, votes, elapsed); err != nil {
			return nil, fmt.Errorf("acquire %q: %w", key, err)
		}
	}
}

// attempts is what one Acquire keeps between its tries.
type attempts struct {
	l     *Locker
	key   string
	w     Wait
	owner string // the latest attempt's
	// sent holds per node a channel closed once every acquire request sent
	// there has ended; unanswered marks the nodes where one ended without
	// an answer (it may still land there). The requests that end the wait
	// or the lease go after them, and bury the owner where unanswered.
	sent        []<-chan struct{}
	unanswered  []atomic.Bool
	unreachable int // attempts in a row that no majority answered
}

// try makes one attempt with a new owner, sent at sent: granted when a
// majority said yes within the validity. Otherwise it undoes the attempt:
// our key may be on some nodes (a minority, or a majority too late, or a
// reply lost or not waited for).
func (a *attempts) try(ctx context.Context, sent time.Time) (granted bool, t Tally, votes []Vote, elapsed time.Duration) {
	l := a.l
	owner := newOwner()
	a.owner = owner
	failed := make([]atomic.Bool, len(l.nodes)) // this attempt's unanswered nodes
	votes, done := l.cfg.Fanout.Ask(l.request(Request{Ctx: ctx, Base: ctx, Timeout: l.cfg.NodeTimeout, Decided: l.decides, Hurry: true,
		Do: func(ctx context.Context, i int) Vote {
			v := a.w.Try(ctx, i, l.nodes[i], owner)
			if v.Err != nil {
				failed[i].Store(true)
				a.unanswered[i].Store(true)
			}
			return v
		}}))
	for i := range a.sent {
		a.sent[i] = both(a.sent[i], done[i])
	}
	elapsed, t = time.Since(sent), Count(votes)
	if t.Yes >= l.quorum && elapsed < l.cfg.TTL-keepalive.Drift(l.cfg.TTL) {
		return true, t, votes, elapsed
	}
	if t.Yes+t.Failed+t.Pending > 0 {
		// The undo waits for the attempt's own request on each node, then
		// gets a TTL from there: nobody waits for it.
		Send(l.request(Request{Base: context.WithoutCancel(ctx), Timeout: l.cfg.TTL, After: done,
			Only: func(i int) bool { return votes[i].Yes || votes[i].Err != nil },
			Do: func(ctx context.Context, i int) Vote {
				return a.w.End(ctx, i, l.nodes[i], owner, false, failed[i].Load())
			}}))
	}
	return false, t, votes, elapsed
}

// end ends the wait or the lease on every node, after its acquire
// requests there: it returns once decided (nil: at once), the requests
// going on in the background on a fresh context, each bounded by the TTL.
func (a *attempts) end(ctx context.Context, decided func(Tally) bool) Tally {
	l, owner := a.l, a.owner
	r := l.request(Request{Ctx: ctx, Base: context.WithoutCancel(ctx), Timeout: l.cfg.TTL, After: a.sent, Decided: decided,
		Do: func(ctx context.Context, i int) Vote {
			return a.w.End(ctx, i, l.nodes[i], owner, true, a.unanswered[i].Load())
		}})
	if decided == nil {
		Send(r)
		return Tally{}
	}
	votes, _ := l.cfg.Fanout.Ask(r)
	return Count(votes)
}

// grant wraps a granted lock in a lease and starts its watchdog, whose
// validity runs from sent, when the acquire requests were sent.
func (l *Locker) grant(ctx context.Context, a *attempts, sent time.Time) (locking.Lease, error) {
	s := &lease{a: a}
	var onFail func(error)
	if f := l.cfg.OnRenewalFailed; f != nil {
		onFail = func(err error) { f(a.key, err) }
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		a.end(ctx, nil)
		return nil, fmt.Errorf("acquire %q: %w", a.key, ErrClosed)
	}
	s.ka = keepalive.Start(l.cfg.TTL, sent, s.renew, onFail)
	l.leases[s] = struct{}{}
	return s, nil
}

// Close stops the renewal of the leases still held, closing their Lost
// channels (their keys expire within the TTL), ends the waits in progress
// with ErrClosed, and closes the Queue's subscriptions.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.closing)
	leases := l.leases
	l.leases = nil
	l.mu.Unlock()
	for s := range leases {
		s.ka.Stop()
		s.ka.MarkLost()
	}
	l.cancel() // the requests still under way
	if err := l.cfg.Queue.Close(); err != nil {
		return fmt.Errorf("close redlock: %w", err)
	}
	return nil
}

type lease struct {
	a        *attempts // the owner, and the requests Release goes after
	ka       *keepalive.Watchdog
	released atomic.Bool
}

func (s *lease) Key() string           { return s.a.key }
func (s *lease) Token() uint64         { return 0 } // no safe token: see the package doc
func (s *lease) Lost() <-chan struct{} { return s.ka.Lost() }

// renew extends the key on every node where it is still the lease's. It
// succeeds only when a majority confirms within ctx, which the watchdog
// bounds by the current validity. Requests left to finish after renew
// returns (quorum) run free of ctx's end, bounded by its deadline.
func (s *lease) renew(ctx context.Context) error {
	l := s.a.l
	timeout := l.cfg.NodeTimeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	lock, ttl := l.cfg.Prefix+"{"+s.a.key+"}", l.cfg.TTL.Milliseconds()
	t := l.ask(Request{Ctx: ctx, Base: context.WithoutCancel(ctx), Timeout: timeout, Decided: l.confirmed, Do: func(ctx context.Context, i int) Vote {
		ok, err := renew.Run(ctx, l.nodes[i], []string{lock}, s.a.owner, ttl).Bool()
		return Vote{Yes: ok, Err: err}
	}})
	switch {
	case t.Yes >= l.quorum:
		return nil
	case t.No > len(l.nodes)-l.quorum:
		return fmt.Errorf("renew %q: %w (held on %d of %d nodes)", s.a.key, locking.ErrNotHeld, t.Yes, len(l.nodes))
	}
	return fmt.Errorf("renew %q: %w: confirmed by %d of %d nodes: %w", s.a.key, locking.ErrUnavailable, t.Yes, len(l.nodes), t.Errs)
}

// Release stops the watchdog, then deletes the key on every node where it
// is still the lease's. A node not reached keeps the key until it expires,
// so waiting longer than the TTL is pointless: ctx is cut to it.
func (s *lease) Release(ctx context.Context) error {
	l := s.a.l
	if !s.released.CompareAndSwap(false, true) {
		return fmt.Errorf("release %q: %w", s.a.key, locking.ErrNotHeld)
	}
	s.ka.Stop()
	l.mu.Lock()
	delete(l.leases, s)
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, l.cfg.TTL)
	defer cancel()
	t := s.a.end(ctx, l.confirmed)
	switch {
	case t.Yes >= l.quorum:
		return nil
	case t.No > len(l.nodes)-l.quorum:
		s.ka.MarkLost()
		return fmt.Errorf("release %q: %w (held on %d of %d nodes)", s.a.key, locking.ErrNotHeld, t.Yes, len(l.nodes))
	}
	return fmt.Errorf("release %q: %w: released on %d of %d nodes: %w", s.a.key, locking.ErrUnavailable, t.Yes, len(l.nodes), t.Errs)
}

// newOwner returns 16 random bytes in hex: owners never repeat, so an owner
// check cannot mistake another holder, or another attempt, for this one.
func newOwner() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand, Go 1.24)
	return hex.EncodeToString(b[:])
}

// checkKey refuses an empty key, or one with a brace, which would end the
// hash tag {key} early or open another.
func checkKey(key string) error {
	switch {
	case key == "":
		return errors.New(`acquire "": empty key`)
	case strings.ContainsAny(key, "{}"):
		return fmt.Errorf("acquire %q: a key may not contain { or } (they delimit the Redis hash tag)", key)
	}
	return nil
}
