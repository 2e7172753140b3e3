// Package redlock is the Redlock algorithm over N >= 3 independent Redis
// masters: a lock is held while a majority of the nodes hold its key.
//
// # How it works
//
// Acquire sends SET lock owner NX PX ttl (a random 128-bit owner) to every
// node at once, each request bounded by a per-node timeout that is small
// next to the TTL. The lock is granted when a majority said yes and time is
// left: validity = TTL - elapsed - drift (keepalive.Drift), measured from the
// moment the requests were sent. Otherwise the attempt removes its key from
// every node at once, with a fresh context (a node may have set the key and
// lost the reply), and tries again. The watchdog (keepalive.Watchdog)
// renews every TTL/3 with an owner-checked PEXPIRE on every node; a renewal
// counts only when a majority confirms it before the current validity runs
// out. Release deletes the key by owner check on every node.
//
// Every request returns as soon as the answers in settle it (a majority
// said yes, or too many refused for one to); the nodes yet to answer are
// not waited for, and their requests end in the background at their
// timeout (or at Close); a renewal's finish within the validity, so the
// slower nodes are renewed too. A black-holed minority thus costs an
// Acquire or a Release nothing. A request that undoes or ends an attempt on
// a node goes there only after the attempt's own request there has ended,
// with its own time counted from then: sent on another connection, it
// could otherwise overtake it and leave the key (or the waiter's place)
// behind for a TTL. That orders them as the client sees them end; since a
// network that holds back one connection's bytes can still reorder them,
// on a node where an acquire request had no answer the request that ends
// its attempt, wait or lease also leaves a tombstone of the owner and the
// waiter for a TTL, and an acquire that arrives later is refused there.
//
// Waiting is by notification, with the redis backend's fair queue
// (locking/internal/waitq) on every node: a refused try also queues the
// waiter there, at a place the waiter chose once (the time it began, the
// same on every node, so every node orders its waiters alike), and a
// release, on each node, wakes the first live waiter there by a message on
// its Locker's channel "lock:{k}:wake:<locker id>" (one shared subscription
// connection per node per Locker). A waiter keeps its place until its try
// takes the lock, and a newcomer that finds the lock free on a node where a
// live waiter is queued is refused there: since the nodes order waiters
// alike, the first waiter gets the freed majority even when a newcomer
// arrives during its round trip, and waiters are served in order. The woken
// waiter tries once a majority of nodes has told it (the release has
// reached enough nodes), or after the time of one attempt; without news it
// tries when its fallback timer fires, a jittered backoff capped by the time
// until enough keys expire (or enough first waiters' places lapse) for a
// majority. A waiter that gives up leaves every queue and passes the
// wake-up on where the lock is free. Notification and not polling, because
// random sleeps (redsync: 50-250 ms) cap a hot key at a few handoffs per
// second. Any node can tell, so a minority of nodes down does not slow the
// handoff. After a split vote (several contenders each got some nodes, none
// a majority) the contenders retry after random delays, growing from the
// time of one attempt with each split in a row, as the Redlock description
// asks, so that they do not meet again.
//
// # Failure modes
//
// Redlock is an efficiency lock, not a correctness lock (Kleppmann, "How to
// do distributed locking", 2016; antirez, "Is Redlock safe?", 2016):
//
//   - A holder paused or delayed past its validity loses the lock while it
//     believes it holds it, as with any lease. Lost closes when the validity
//     of the last majority-confirmed renewal runs out, but a paused process
//     cannot look.
//   - A node restarted without persistence forgets the keys it held; with
//     its vote another contender can assemble a second majority while the
//     first holder is still valid. Run nodes with appendfsync always, or
//     keep a restarted node out for longer than the TTL (antirez's delayed
//     restart).
//   - Redis expires keys by its wall clock: a node whose clock jumps forward
//     frees its key early, and its vote can again make a second majority.
//   - A minority of nodes down or slow costs nothing but latency; with no
//     majority reachable, Acquire fails with locking.ErrUnavailable and
//     renewals fail until Lost closes.
//
// # Token
//
// Token is always 0: Redlock has no safe fencing token. Kleppmann's point
// is that a lock whose safety rests on timing (pauses, network delays, the
// nodes' wall clocks) needs a token to be safe, and Redlock cannot make one:
// a counter kept on every node drifts apart (an INCR reaches some nodes and
// not others, a restarted node starts again from nothing), so no majority
// of counters is sure to exceed every earlier grant, and a second majority
// from a restarted or clock-jumped node is a second holder no counter
// orders. antirez's answer, using the random owner as a compare-and-set
// value in storage, orders nothing either. Where writes must be safe, guard
// them in storage (the version guard), or use a lock with a real token
// (redis on one durable master, zookeeper, etcd, mysql).
package redlock

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/internal/waitq"
	"github.com/oversold-lab/oversold/locking/keepalive"
)

var _ locking.Locker = (*Locker)(nil)

// ErrClosed is returned by Acquire on a closed Locker.
var ErrClosed = errors.New("redlock: locker closed")

var scripts = waitq.Default

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
	// MinBackoff and MaxBackoff bound the random delays between tries that
	// no release message cut short. 0 = 5ms and 1s.
	MinBackoff, MaxBackoff time.Duration
	// OnRenewalFailed, if set, hears every failed renewal (for metrics).
	OnRenewalFailed func(key string, err error)
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
	return c
}

// Locker grants leases held on a majority of independent Redis masters. It
// is safe for concurrent use.
type Locker struct {
	nodes  []node
	quorum int
	cfg    Config
	id     string // names this Locker's waiters and wake channels
	ttl    string // cfg.TTL in milliseconds, as the scripts take it
	life   string // how long a waiter's queue entry outlives its last try, in ms

	mu      sync.Mutex
	leases  map[*lease]struct{} // live leases, ended by Close
	closed  bool
	closing chan struct{}
	// Requests still under way after their caller returned (see ask) end
	// at their timeout, or once stop is cancelled by Close.
	stop   context.Context
	cancel context.CancelFunc
}

type node struct {
	client   redis.UniversalClient
	notifier *waitq.Notifier
	// slow: the node's last request ran out its timeout unanswered (black-
	// holed, or far slower than the rest). Only such a node is left behind
	// by an acquire attempt's hurry; any answer clears it.
	slow *atomic.Bool
}

// New returns a Locker on the given independent masters (not replicas of
// each other, not one Cluster: Redlock's votes must fail independently).
// Close does not close the clients.
func New(clients []redis.UniversalClient, cfg Config) (*Locker, error) {
	if len(clients) < 3 {
		return nil, fmt.Errorf("redlock: %d nodes given, want at least 3 independent masters", len(clients))
	}
	cfg = cfg.withDefaults()
	l := &Locker{
		quorum: len(clients)/2 + 1,
		cfg:    cfg,
		id:     waitq.NewOwner()[:16],
		ttl:    strconv.FormatInt(cfg.TTL.Milliseconds(), 10),
		// More than the longest wait between two tries (a split delay,
		// then a fallback wait): a live waiter's entry does not expire.
		life:    strconv.FormatInt((3 * (cfg.MaxBackoff + cfg.MinBackoff)).Milliseconds(), 10),
		leases:  make(map[*lease]struct{}),
		closing: make(chan struct{}),
	}
	l.stop, l.cancel = context.WithCancel(context.Background())
	for _, c := range clients {
		l.nodes = append(l.nodes, node{client: c, notifier: waitq.NewNotifier(c), slow: new(atomic.Bool)})
	}
	return l, nil
}

// Ping checks that a majority of the nodes answer: Redlock works with a
// minority down.
func (l *Locker) Ping(ctx context.Context) error {
	votes, _ := l.ask(request{ctx: ctx, base: ctx, timeout: l.cfg.TTL, decided: l.confirmed, do: func(ctx context.Context, _ int, c redis.UniversalClient) vote {
		return vote{yes: true, err: c.Ping(ctx).Err()}
	}})
	t := count(votes)
	if t.yes < l.quorum {
		return fmt.Errorf("ping: %d of %d nodes answer, want %d: %w", t.yes, len(l.nodes), l.quorum, t.errs)
	}
	return nil
}

// vote is one node's answer to one request.
type vote struct {
	yes    bool
	holder string        // a refused acquire: the holder's owner there,
	pttl   time.Duration // and its remaining TTL
	err    error
}

// request is one request to every node (or every node i with only(i)).
type request struct {
	ctx  context.Context // the caller's: ask returns when it ends
	base context.Context // the requests', each bounded by timeout and Close
	// timeout bounds each node's request, counted from the call to ask,
	// or from the end of the earlier request there (after).
	timeout time.Duration
	only    func(i int) bool // nil: every node
	// after, if set, holds per node a channel closed once an earlier
	// request there has ended: this one is sent after it, so that a
	// release cannot overtake the acquire it undoes (they travel on
	// different connections).
	after []<-chan struct{}
	// decided tells from the answers in so far whether the outcome is
	// settled (nil: wait for every answer).
	decided func(tally) bool
	// hurry: once a majority has answered without settling the outcome,
	// wait for nodes known slow (node.slow) only as long again as that
	// majority took: an acquire attempt, which can be tried again, does not
	// wait out a black-holed node each time, yet still hears a healthy node
	// a few ms farther whose vote decides.
	hurry bool
	do    func(ctx context.Context, i int, c redis.UniversalClient) vote // node i's request
	// failed, if set, hears of each node whose request ended without an
	// answer (timed out, cut off, failed), before its done channel closes:
	// the request may still be executed there, later.
	failed func(i int)
}

// ask sends r to the nodes at once and returns their answers in node order
// as soon as r.decided settles the outcome, every node asked has answered,
// r.ctx ends, or the hurry grace is over. A node yet to answer then reads
// errNoAnswer, and its request goes on in the background until it ends
// (at r.timeout at the latest): a black-holed minority costs a majority's
// answer nothing. done holds per node a channel closed once its request
// has ended (at once for a node not asked).
func (l *Locker) ask(r request) (votes []vote, done []<-chan struct{}) {
	type answer struct {
		i int
		v vote
	}
	if waitAll.Load() {
		r.decided, r.hurry = nil, false
	}
	votes = make([]vote, len(l.nodes))
	done = make([]<-chan struct{}, len(l.nodes))
	answers := make(chan answer, len(l.nodes))
	asked := 0
	for i, nd := range l.nodes {
		if r.only != nil && !r.only(i) {
			done[i] = closed
			continue
		}
		asked++
		votes[i] = vote{err: fmt.Errorf("node %d: %w", i, errNoAnswer)}
		ended := make(chan struct{})
		done[i] = ended
		go func() {
			defer close(ended)
			if r.after != nil && r.after[i] != nil {
				// The earlier request ends at its own timeout: the wait
				// is bounded, and this request's time starts after it.
				select {
				case <-r.after[i]:
				case <-r.base.Done():
				case <-l.stop.Done():
				}
			}
			ctx, cancel := context.WithTimeout(r.base, r.timeout)
			defer cancel()
			stop := context.AfterFunc(l.stop, cancel)
			defer stop()
			v := vote{err: ctx.Err()}
			if v.err == nil {
				v = r.do(ctx, i, nd.client)
				var reply redis.Error
				switch {
				case v.err == nil, errors.As(v.err, &reply):
					nd.slow.Store(false)
				case errors.Is(ctx.Err(), context.DeadlineExceeded) && r.base.Err() == nil:
					nd.slow.Store(true)
				}
			}
			if v.err != nil && r.failed != nil {
				r.failed(i)
			}
			answers <- answer{i, v} // buffered: never blocks
		}()
	}
	start, answered := time.Now(), 0
	in := make([]bool, len(l.nodes))
	// onlySlowLeft: every node yet to answer ran out its last timeout.
	onlySlowLeft := func() bool {
		for i, nd := range l.nodes {
			if done[i] != closed && !in[i] && !nd.slow.Load() {
				return false
			}
		}
		return true
	}
	var grace <-chan time.Time
	for answered < asked && (r.decided == nil || !r.decided(count(votes))) {
		select {
		case a := <-answers:
			votes[a.i], in[a.i] = a.v, true
			if answered++; r.hurry && grace == nil && answered >= l.quorum && answered < asked && onlySlowLeft() {
				grace = time.After(max(time.Since(start), time.Millisecond))
			}
		case <-grace:
			return votes, done
		case <-r.ctx.Done():
			return votes, done
		}
	}
	return votes, done
}

// closed is a closed channel: a request with nothing to wait for.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// both returns a channel closed once a and b are (nil counts as closed).
func both(a, b <-chan struct{}) <-chan struct{} {
	switch {
	case a == nil || isDone(a):
		return b
	case b == nil || isDone(b):
		return a
	}
	c := make(chan struct{})
	go func() {
		<-a
		<-b
		close(c)
	}()
	return c
}

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// waitAll, set only by tests, makes every request wait for every node: the
// broken variant the quorum tests must catch.
var waitAll atomic.Bool

// errNoAnswer marks a node whose answer was not waited for.
var errNoAnswer = errors.New("no answer yet")

// confirmed: a majority said yes, or too many said no for one to.
func (l *Locker) confirmed(t tally) bool {
	return t.yes >= l.quorum || t.no > len(l.nodes)-l.quorum
}

// decides: a majority said yes, or too many refused or failed for one to.
func (l *Locker) decides(t tally) bool {
	return t.yes >= l.quorum || t.no+t.failed > len(l.nodes)-l.quorum
}

// tally counts the answers to one request.
type tally struct {
	yes, no, failed, down int
	pending               int             // not waited for (see ask)
	holders               map[string]int  // refusals per holder
	pttls                 []time.Duration // of the refusals with a TTL
	errs                  nodeErrors
}

// nodeErrors are the failures of several nodes, on one line.
type nodeErrors []error

func (e nodeErrors) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (e nodeErrors) Unwrap() []error { return e }

func count(votes []vote) tally {
	t := tally{holders: make(map[string]int)}
	for _, v := range votes {
		switch {
		case errors.Is(v.err, errNoAnswer):
			t.pending++
			t.errs = append(t.errs, v.err)
		case v.err != nil:
			t.failed++
			t.errs = append(t.errs, v.err)
			if !isTimeout(v.err) {
				t.down++ // refused, reset: not merely slow
			}
		case v.yes:
			t.yes++
		default:
			t.no++
			t.holders[v.holder]++
			if v.pttl >= 0 {
				t.pttls = append(t.pttls, v.pttl)
			}
		}
	}
	return t
}

func isTimeout(err error) bool {
	var nerr net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &nerr) && nerr.Timeout()
}

// held reports whether someone holds the lock on a majority.
func (t tally) held(quorum int) bool {
	for _, n := range t.holders {
		if n >= quorum {
			return true
		}
	}
	return false
}

// freeIn is how long until enough holders' keys expire for a majority to
// be free, counting the nodes that said yes as free; negative if unknown.
func (t tally) freeIn(quorum int) time.Duration {
	need := quorum - t.yes
	if need <= 0 {
		return 0
	}
	if need > len(t.pttls) {
		return -1
	}
	slices.Sort(t.pttls)
	return t.pttls[need-1]
}

// Acquire waits until a majority of the nodes grant the lock on key, ctx
// ends, or too many nodes fail.
func (l *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if err := waitq.CheckKey(key); err != nil {
		return nil, err
	}
	n := waitq.NamesOf(l.cfg.Prefix, key)
	member := waitq.Member(l.id, waitq.NewOwner()) // our place in the queues
	// A new owner value per attempt: the undo of an attempt, which goes
	// on in the background, cannot delete a later attempt's key.
	var owner string
	// The same place on every node, so that the nodes order their waiters
	// alike: a waiter first on one node is first on all that have it. A
	// node that grants keeps the place too ("keep"): a grant there is not
	// yet a majority, and the waiter must stay first there if the attempt
	// fails; Release (or the end of the wait) takes the place out.
	place := strconv.FormatInt(time.Now().UnixMicro(), 10)
	w := &waiter{l: l, Waiter: waitq.NewWaiter(l.notifiers(), n.Wake+l.id, member), timer: time.NewTimer(time.Hour), sent: make([]<-chan struct{}, len(l.nodes)), unanswered: make([]atomic.Bool, len(l.nodes))}
	defer w.stop()
	granted := false
	defer func() {
		if !granted && w.queued {
			l.leave(ctx, n, owner, member, w.sent, w.unanswered)
		}
	}()
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("acquire %q: %w", key, err)
		}
		owner = waitq.NewOwner()
		mine := owner // read by requests that outlive the attempt
		sent := time.Now()
		failed := make([]atomic.Bool, len(l.nodes)) // this attempt's unanswered nodes
		votes, done := l.ask(request{ctx: ctx, base: ctx, timeout: l.cfg.NodeTimeout, decided: l.decides, hurry: true, failed: func(i int) {
			failed[i].Store(true)
			w.unanswered[i].Store(true)
		}, do: func(ctx context.Context, _ int, c redis.UniversalClient) vote {
			// 't': refused where this owner or member was buried (see
			// release): the request came after its undo or leave.
			return acquireVote(scripts.Acquire.Run(ctx, c, []string{n.Lock, n.Queue, n.Alive}, mine, l.ttl, member, l.life, place, n.Wake, "keep", "", "", "t").Slice())
		}})
		for i := range w.sent {
			w.sent[i] = both(w.sent[i], done[i])
		}
		elapsed := time.Since(sent)
		t := count(votes)
		if t.yes >= l.quorum && elapsed < l.cfg.TTL-keepalive.Drift(l.cfg.TTL) {
			w.Drain()
			granted = true
			return l.grant(ctx, key, n, owner, member, sent, w.sent, w.unanswered)
		}
		w.queued = true // by the nodes that refused
		if t.yes > 0 || t.failed > 0 || t.pending > 0 {
			// Our key may be on some nodes (a minority, or a majority
			// too late, or a reply lost or not waited for): remove it
			// from them.
			l.undo(ctx, n, owner, votes, done, failed)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("acquire %q: %w", key, ctx.Err())
		}
		if t.failed <= len(l.nodes)-l.quorum {
			w.unreachable = 0 // a majority answered, or may yet
		} else if w.unreachable++; w.unreachable >= maxUnreachable || t.down > len(l.nodes)-l.quorum {
			return nil, fmt.Errorf("acquire %q: %w: no majority of nodes answers: %w", key, locking.ErrUnavailable, t.errs)
		}
		if err := w.next(ctx, attempt, t, elapsed); err != nil {
			return nil, fmt.Errorf("acquire %q: %w", key, err)
		}
	}
}

// waiter is what one Acquire keeps between its tries.
type waiter struct {
	*waitq.Waiter
	l      *Locker
	queued bool // a try was refused: the waiter is in some queues
	timer  *time.Timer
	// sent holds per node a channel closed once every acquire request
	// sent there has ended: the requests that end the wait or the lease
	// there go after them, so that a late acquire cannot put the key or
	// the place back once they are gone.
	sent []<-chan struct{}
	// unanswered marks the nodes where an acquire request ended without
	// an answer: it may still land there, after the request that ends the
	// wait or the lease, which therefore buries owner and member there.
	// Set by the request itself as it ends (request.failed), read by the
	// requests that go after it (sent).
	unanswered []atomic.Bool
	// splits counts the split votes in a row; unreachable the attempts in
	// a row that no majority of nodes answered. A refused connection is
	// known at once, but a dead node may also look merely slow (the
	// per-node timeout cuts the client's dial retries short), so a few
	// such attempts are enough.
	splits, unreachable int
}

func (l *Locker) notifiers() []*waitq.Notifier {
	ns := make([]*waitq.Notifier, len(l.nodes))
	for i, nd := range l.nodes {
		ns[i] = nd.notifier
	}
	return ns
}

func (w *waiter) stop() {
	w.Stop()
	w.timer.Stop()
}

// next waits until the next try is due, after a try that found t.
func (w *waiter) next(ctx context.Context, attempt int, t tally, elapsed time.Duration) error {
	l := w.l
	if t.yes > 0 {
		// Our key got some nodes, not a majority, and is gone again: a
		// split vote (contenders each got some nodes), or a holder whose
		// release reached some nodes first. Pause for a random while so
		// that the contenders do not meet again (the Redlock
		// description's advice), longer with every split in a row;
		// messages wait in wake meanwhile. Then retry after a split, or
		// wait for the holder's release as usual.
		held := t.held(l.quorum)
		if w.splits++; held {
			w.splits = 0
		}
		// The pause grows from the time of one attempt: a pause much
		// longer than the attempts that split leaves the lock idle.
		w.timer.Reset(mrand.N(min(l.cfg.MaxBackoff, max(elapsed, time.Millisecond)<<min(w.splits, 20))) + 1)
		if _, err := w.wait(ctx, nil); err != nil || !held {
			return err
		}
	} else {
		w.splits = 0
	}
	w.timer.Reset(waitq.Backoff(l.cfg.MinBackoff, l.cfg.MaxBackoff, attempt, t.freeIn(l.quorum)))
	if w.Listening() < len(l.nodes) {
		// Subscribe on every node, and try again once a majority
		// confirms (or the delay ends): a release between the first try
		// and the subscriptions is not lost. Not all: a node down or
		// black-holed never confirms.
		_, err := w.confirmed(ctx, w.Subscribe(), l.quorum)
		return err // or the timer fired
	}
	if ok, err := w.wait(ctx, w.Wake); !ok {
		return err
	}
	// A release reaches the nodes one by one, and each node whose queue
	// has us first tells us. Try once a majority has told us, so that we
	// try once per release, not once per node, and not before the release
	// reached enough nodes; or after the time of one attempt, if the
	// nodes woke different waiters or some message is late.
	w.timer.Reset(min(elapsed, l.cfg.NodeTimeout))
	for heard := 1; heard < l.quorum; heard++ {
		ok, err := w.wait(ctx, w.Wake)
		if err != nil {
			return err
		}
		if !ok {
			break // the timer fired
		}
	}
	w.timer.Stop()
	w.Drain()
	return nil
}

// confirmed waits until k of the ready channels are closed (ok), the timer
// fires, or ctx or the Locker ends (an error).
func (w *waiter) confirmed(ctx context.Context, ready []<-chan struct{}, k int) (ok bool, err error) {
	cases := []reflect.SelectCase{
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.timer.C)},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.l.closing)},
	}
	for _, r := range ready {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(r)})
	}
	for ; k > 0; k-- {
		switch i, _, _ := reflect.Select(cases); i {
		case 0:
			return false, nil
		case 1:
			return false, ctx.Err()
		case 2:
			return false, ErrClosed
		default:
			cases[i].Chan = reflect.Value{} // closed: Select ignores it now
		}
	}
	return true, nil
}

// wait waits for c (ok), the timer, or the end of ctx or of the Locker (an
// error).
func (w *waiter) wait(ctx context.Context, c <-chan struct{}) (ok bool, err error) {
	select {
	case <-c:
		return true, nil
	case <-w.timer.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	case <-w.l.closing:
		return false, ErrClosed
	}
}

// acquireVote reads the acquire script's answer: {1, 0}, or {0, ms to wait
// at most, the holder's owner or ” (free, but another waiter is first)}.
func acquireVote(res []any, err error) vote {
	if err != nil {
		return vote{err: err}
	}
	if len(res) == 2 && res[0] == int64(1) {
		return vote{yes: true}
	}
	if len(res) == 3 {
		pttl, ok1 := res[1].(int64)
		holder, ok2 := res[2].(string)
		if ok1 && ok2 {
			return vote{holder: holder, pttl: time.Duration(pttl) * time.Millisecond}
		}
	}
	return vote{err: fmt.Errorf("acquire script returned %v", res)}
}

// undo deletes owner's key from the nodes that did not refuse an attempt
// (votes), each after the attempt's own request there (done), in the
// background, on a fresh context. Each node's request is bounded by the
// TTL, counted from the end of the attempt's request there, as Release's
// are: nobody waits for it, and a node stalled past the per-node timeout
// (an fsync, a fork) executes the attempt's request when it resumes, so
// the undo must still come after it; a node not reached
// within a TTL keeps the key for one TTL. Where the attempt's request
// ended without an answer (failed), it buries the owner (see release):
// that request may still come after the undo. It wakes nobody: after a
// split vote the contenders retry by themselves, and a lock held elsewhere
// is not free.
func (l *Locker) undo(ctx context.Context, n waitq.Names, owner string, votes []vote, done []<-chan struct{}, failed []atomic.Bool) {
	l.release(ctx, context.WithoutCancel(ctx), l.cfg.TTL, done, n, owner, "", false, buried(failed), always,
		func(i int) bool { return votes[i].yes || votes[i].err != nil })
}

// leave ends a wait that did not get the lock: in the background, on a
// fresh context, after the wait's acquire requests (sent), each node
// bounded as undo's, it deletes owner's key where it is still owner's,
// takes member out of every queue, and wakes the next waiter where the
// lock is free (the wake-up of the last release may have come to us),
// burying owner and member where an acquire request of the wait had no
// answer (unanswered). What it cannot reach expires.
func (l *Locker) leave(ctx context.Context, n waitq.Names, owner, member string, sent []<-chan struct{}, unanswered []atomic.Bool) {
	l.release(ctx, context.WithoutCancel(ctx), l.cfg.TTL, sent, n, owner, member, true, buried(unanswered), always, nil)
}

// buried is release's bury for the nodes marked in unanswered.
func buried(unanswered []atomic.Bool) func(int) bool {
	return func(i int) bool { return unanswered[i].Load() }
}

// always decides at once: the requests go on in the background.
func always(tally) bool { return true }

// release deletes owner's key from the nodes (all, or those with only(i))
// where it is still owner's, drops member (if any) from their queues, and
// if wake, wakes the first waiter of each node where the lock is free. On
// the nodes i with bury(i), asked once the request in after has ended
// there, it also leaves a tombstone of owner and member for a TTL, which makes the acquire script refuse them: an acquire
// request that had no answer there may land after this one (it ended
// first as the client saw it, but two connections can be reordered by the
// network), and would set the key or queue the member again. It returns once decided (see ask), the requests running on base,
// each node's after its request in after.
func (l *Locker) release(ctx, base context.Context, timeout time.Duration, after []<-chan struct{}, n waitq.Names, owner, member string, wake bool, bury func(int) bool, decided func(tally) bool, only func(int) bool) tally {
	w := "0"
	if wake {
		w = "1"
	}
	votes, _ := l.ask(request{ctx: ctx, base: base, timeout: timeout, only: only, after: after, decided: decided, do: func(ctx context.Context, i int, c redis.UniversalClient) vote {
		args := []any{owner, n.Wake, member, w}
		if bury != nil && bury(i) {
			args = append(args, "", l.ttl, "t")
		}
		ok, err := scripts.Release.Run(ctx, c, []string{n.Lock, n.Queue, n.Alive}, args...).Bool()
		return vote{yes: ok, err: err}
	}})
	return count(votes)
}

// grant wraps a granted lock in a lease and starts its watchdog, whose
// validity runs from sent, when the acquire requests were sent.
func (l *Locker) grant(ctx context.Context, key string, n waitq.Names, owner, member string, sent time.Time, acquires []<-chan struct{}, unanswered []atomic.Bool) (locking.Lease, error) {
	s := &lease{l: l, key: key, names: n, owner: owner, member: member, acquires: acquires, unanswered: unanswered}
	var onFail func(error)
	if f := l.cfg.OnRenewalFailed; f != nil {
		onFail = func(err error) { f(key, err) }
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.leave(ctx, n, owner, member, acquires, unanswered)
		return nil, fmt.Errorf("acquire %q: %w", key, ErrClosed)
	}
	s.ka = keepalive.Start(l.cfg.TTL, sent, s.renew, onFail)
	l.leases[s] = struct{}{}
	l.mu.Unlock()
	return s, nil
}

// Close stops the renewal of the leases still held, closing their Lost
// channels (their keys expire within the TTL), ends the waits in progress
// with ErrClosed, and closes the subscription connections.
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
	var errs []error
	for _, nd := range l.nodes {
		errs = append(errs, nd.notifier.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close redlock: %w", err)
	}
	return nil
}

func (l *Locker) forget(s *lease) {
	l.mu.Lock()
	delete(l.leases, s)
	l.mu.Unlock()
}

type lease struct {
	l        *Locker
	key      string
	names    waitq.Names
	owner    string
	member   string            // its waiter's queue entry, kept by every node (see Acquire)
	acquires []<-chan struct{} // per node, closed once its acquire requests ended
	// unanswered marks the nodes where an acquire request had no answer:
	// Release buries owner and member there (see release).
	unanswered []atomic.Bool
	ka         *keepalive.Watchdog
	released   atomic.Bool
}

func (s *lease) Key() string           { return s.key }
func (s *lease) Token() uint64         { return 0 } // no safe token: see the package doc
func (s *lease) Lost() <-chan struct{} { return s.ka.Lost() }

// renew extends the key on every node where it is still the lease's. It
// succeeds only when a majority confirms within ctx, which the watchdog
// bounds by the current validity. The nodes that answer after the majority
// are still renewed: their requests go on in the background, free of ctx's
// end (the watchdog cancels it once renew returns) but bounded by its
// deadline, since a renewal past the validity is worthless. Cut off with
// the majority's answer, a request still waiting for a connection would
// never be sent, that node's key would expire at the TTL, and one more
// slow node later would lose the lease.
func (s *lease) renew(ctx context.Context) error {
	l := s.l
	timeout := l.cfg.NodeTimeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	votes, _ := l.ask(request{ctx: ctx, base: context.WithoutCancel(ctx), timeout: timeout, decided: l.confirmed, do: func(ctx context.Context, _ int, c redis.UniversalClient) vote {
		ok, err := scripts.Renew.Run(ctx, c, []string{s.names.Lock}, s.owner, l.ttl).Bool()
		return vote{yes: ok, err: err}
	}})
	t := count(votes)
	switch {
	case t.yes >= l.quorum:
		return nil
	case t.no > len(l.nodes)-l.quorum:
		return fmt.Errorf("renew %q: %w (held on %d of %d nodes)", s.key, locking.ErrNotHeld, t.yes, len(l.nodes))
	}
	return fmt.Errorf("renew %q: %w: confirmed by %d of %d nodes: %w", s.key, locking.ErrUnavailable, t.yes, len(l.nodes), t.errs)
}

// Release stops the watchdog, then deletes the key on every node where it
// is still the lease's. It returns once a majority has answered (a slow or
// black-holed minority is not waited for): the deletes go on in the
// background on a fresh context, each bounded by the TTL, after which the
// key is gone anyway. Waiting longer than the TTL is pointless, so ctx is
// cut to it too; nodes that are not reached keep the key until it expires.
func (s *lease) Release(ctx context.Context) error {
	if !s.released.CompareAndSwap(false, true) {
		return fmt.Errorf("release %q: %w", s.key, locking.ErrNotHeld)
	}
	s.ka.Stop()
	s.l.forget(s)
	ctx, cancel := context.WithTimeout(ctx, s.l.cfg.TTL)
	defer cancel()
	t := s.l.release(ctx, context.WithoutCancel(ctx), s.l.cfg.TTL, s.acquires, s.names, s.owner, s.member, true, buried(s.unanswered), s.l.confirmed, nil)
	switch {
	case t.yes >= s.l.quorum:
		return nil
	case t.no > len(s.l.nodes)-s.l.quorum:
		s.ka.MarkLost()
		return fmt.Errorf("release %q: %w (held on %d of %d nodes)", s.key, locking.ErrNotHeld, t.yes, len(s.l.nodes))
	}
	return fmt.Errorf("release %q: %w: released on %d of %d nodes: %w", s.key, locking.ErrUnavailable, t.yes, len(s.l.nodes), t.errs)
}
