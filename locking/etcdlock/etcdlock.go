// Package etcdlock is an etcd lock, the recipe of etcd's concurrency Mutex:
// a Locker keeps one session, a lease it renews (a new one once lost), and
// Acquire puts <Prefix>/<key>/<lease>-<n> on it and reads the head of the
// queue in one transaction. The oldest key holds the lock; any other
// watches the deletion of the last key created before its own.
//
//   - Token is our key's create revision: revisions grow with every write
//     to the cluster, so each later holder has a larger one.
//   - Lost closes when the lease's validity, as the client reckons it,
//     has passed, when the session is lost, and when our key is deleted
//     behind our back.
//   - Release deletes our key by its name, which no other acquisition
//     uses while a delete of it may be in flight (Namer).
//   - A wait ended by ctx, or a Release that failed, leaves the delete of
//     its key to the background, on fresh contexts, until done or moot.
//
// Config plugs in what a service adds (locking/backends composes it): how
// the session is renewed (Renewal), how keys are named (Namer), how a
// waiter waits (Waiter), what becomes of a lost session (OnLost). The
// reasoning, the failure modes and the hardening packages beside this one
// are in docs/locks/etcd.md.
package etcdlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oversold-lab/oversold/locking"
)

var _ locking.Locker = (*Locker)(nil)

const (
	// DefaultPrefix is the parent of every key's queue when Config.Prefix is "".
	DefaultPrefix = "/oversold/locks"
	// DefaultTTL is the session lease's TTL when Config.TTL is 0.
	DefaultTTL = 10 * time.Second

	watchDelay   = 20 * time.Millisecond // a lease held this long watches its key
	tries        = 5                     // requeues of one Acquire; tries of a write
	closeTimeout = 2 * time.Second       // Close's revoke; else the lease expires
)

// Config tunes a Locker. Zero values mean the documented defaults.
type Config struct {
	TTL    time.Duration // the session lease's, in whole seconds (etcd's minimum ~2 s)
	Prefix string        // the parent of each lock key's queue

	// Renew starts the renewal of a lease granted for ttl by a request
	// sent at sent; nil = Renew.
	Renew func(ttl time.Duration, sent time.Time, renew RenewFunc) Renewal
	// Names makes each session's Namer; nil = a counter, never reused.
	Names func() Namer
	// Wait waits for a waiter's predecessor to go; nil = WatchDelete.
	Wait Waiter
	// OnLost, if set, hears of each session lost to the Locker.
	OnLost func(id clientv3.LeaseID, ttl time.Duration)
}

// Waiter waits until pred, the key created just before ours and read at
// revision seen, is deleted. A nil return means "look at the queue again".
type Waiter interface {
	WaitDelete(ctx context.Context, cli *clientv3.Client, pred *mvccpb.KeyValue, seen int64) error
}

var (
	// errRequeue: our key went while we queued; Acquire queues again.
	errRequeue = errors.New("etcdlock: our queue key vanished")
	errClosed  = fmt.Errorf("etcdlock: locker closed: %w", locking.ErrUnavailable)
)

// Locker hands out leases on one etcd session. It is safe for concurrent use.
type Locker struct {
	cli    *clientv3.Client
	cfg    Config
	ctx    context.Context // ends with Close: every request and wait of the Locker
	cancel context.CancelFunc
	wg     sync.WaitGroup // the Locker's goroutines

	granting sync.Mutex // one grant at a time; Close waits for one under way
	mu       sync.Mutex
	sess     *session
	closed   bool

	afterGrant func() // a test's hook between a grant and its publication
}

// New grants the first session within ctx: that is also the check that etcd
// answers. The Locker uses cli but does not close it.
func New(ctx context.Context, cli *clientv3.Client, cfg Config) (*Locker, error) {
	cfg.TTL, cfg.Prefix = cmp.Or(max(cfg.TTL, 0), DefaultTTL), cmp.Or(cfg.Prefix, DefaultPrefix)
	if cfg.Renew == nil {
		cfg.Renew = Renew
	}
	if cfg.Names == nil {
		cfg.Names = func() Namer { return new(counter) }
	}
	cfg.Wait = cmp.Or[Waiter](cfg.Wait, WatchDelete{})
	l := &Locker{cli: cli, cfg: cfg}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	if _, err := l.session(ctx); err != nil {
		l.Close()
		return nil, fmt.Errorf("etcdlock: %w", err)
	}
	return l, nil
}

// goBg runs f on a goroutine Close waits for; false, f not run, once closed.
func (l *Locker) goBg(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Go(f)
	return true
}

// Close ends the Locker's requests and revokes its session, deleting its
// keys; it waits for a grant under way, so as to revoke that session too.
func (l *Locker) Close() error {
	l.mu.Lock()
	closed := l.closed
	l.closed = true
	l.mu.Unlock()
	if closed {
		return nil
	}
	l.cancel()
	l.granting.Lock() // a grant under way has published its session
	l.mu.Lock()
	s := l.sess
	l.mu.Unlock()
	l.granting.Unlock()
	l.wg.Wait()
	if s == nil {
		return nil
	}
	s.r.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if _, err := l.cli.Revoke(ctx, s.id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("etcdlock: close: revoke: %w", err)
	}
	return nil
}

// Acquire queues for key and waits for its turn, ctx, or a failure.
func (l *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if key == "" {
		return nil, errors.New(`acquire "": empty key`)
	}
	pfx := l.cfg.Prefix + "/" + url.PathEscape(key) + "/"
	var err error
	for range tries {
		var s *lease
		if s, err = l.acquire(ctx, key, pfx); err == nil {
			return s, nil
		}
		if !errors.Is(err, errRequeue) || ctx.Err() != nil {
			break
		}
	}
	return nil, locking.AcquireError(ctx, key, err)
}

func (l *Locker) acquire(ctx context.Context, key, pfx string) (*lease, error) {
	sess, err := l.session(ctx)
	if err != nil {
		return nil, err
	}
	n := sess.names.Take(pfx)
	me := pfx + strconv.FormatInt(int64(sess.id), 16) + "-" + strconv.FormatUint(n, 16)
	q, err := l.enqueue(ctx, sess, pfx, me)
	if err != nil {
		sess.names.Give(pfx, n, false) // the cleanup's requests are in flight
		return nil, err
	}
	s, err := l.wait(ctx, sess, key, pfx, me, q)
	if err != nil {
		sess.names.Give(pfx, n, false)
		l.remove(sess, me, q.rev)
		return nil, err
	}
	s.give = func(reuse bool) { sess.names.Give(pfx, n, reuse) }
	return s, nil
}

// queued is our place in the queue, or why we have none.
type queued struct {
	rev   int64 // our key's create revision
	first bool  // ours is the oldest key: we hold the lock
	seen  int64 // the revision at which that was read
	err   error
}

// enqueue runs create, which is never abandoned halfway (it may still land
// on the server): when ctx ends first, the background deletes what it made.
func (l *Locker) enqueue(ctx context.Context, sess *session, pfx, me string) (queued, error) {
	res := make(chan queued, 1)
	if !l.goBg(func() { res <- l.create(sess, pfx, me) }) {
		return queued{}, errClosed
	}
	select {
	case q := <-res:
		if q.err != nil {
			l.remove(sess, me, 0)
		}
		return q, q.err
	case <-ctx.Done():
		l.goBg(func() { l.remove(sess, me, (<-res).rev) })
		return queued{}, ctx.Err()
	}
}

// create puts our key, if not there yet, and reads the head of the queue,
// tried again on failure: a failed try may have landed, found then (Else).
func (l *Locker) create(sess *session, pfx, me string) queued {
	ctx, cancel := context.WithTimeout(sess.ctx, sess.ttl)
	defer cancel()
	head := clientv3.OpGet(pfx, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)
	for try := 0; ; try++ {
		resp, err := l.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(me), "=", 0)).
			Then(clientv3.OpPut(me, "", clientv3.WithLease(sess.id)), head).
			Else(clientv3.OpGet(me, clientv3.WithKeysOnly()), head).
			Commit()
		switch {
		case err == nil:
			q := queued{rev: resp.Header.Revision, seen: resp.Header.Revision}
			if !resp.Succeeded {
				q.rev = resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision
			}
			if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
				q.first = kvs[0].CreateRevision == q.rev
			}
			return q
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			sess.r.MarkLost() // the next session() grants a new one
			return queued{err: errRequeue}
		case l.ctx.Err() != nil:
			return queued{err: errClosed}
		}
		if try == tries-1 || !sleep(ctx, backoff(try)) {
			return queued{err: fmt.Errorf("%w: %w", locking.ErrUnavailable, err)}
		}
	}
}

// wait waits until ours is the oldest key in the queue. Failed requests are
// tried again: an etcd that stays unreachable ends the session, and the wait.
func (l *Locker) wait(parent context.Context, sess *session, key, pfx, me string, q queued) (*lease, error) {
	if q.first {
		return l.hold(sess, key, me, q.rev, q.seen)
	}
	ctx, cancel := context.WithCancel(parent) // the session's end stops it too
	defer cancel()
	defer context.AfterFunc(sess.ctx, cancel)()
	for try := 0; ; try++ {
		// One snapshot: the last key created before ours, and ours.
		resp, err := l.cli.Txn(ctx).Then(
			clientv3.OpGet(pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(q.rev-1), clientv3.WithKeysOnly())...),
			clientv3.OpGet(me, clientv3.WithKeysOnly()),
		).Commit()
		if err == nil {
			if len(resp.Responses[1].GetResponseRange().Kvs) == 0 {
				return nil, errRequeue
			}
			pred := resp.Responses[0].GetResponseRange().Kvs
			if len(pred) == 0 {
				return l.hold(sess, key, me, q.rev, resp.Header.Revision)
			}
			if err = l.cfg.Wait.WaitDelete(clientv3.WithRequireLeader(ctx), l.cli, pred[0], resp.Header.Revision); err == nil {
				continue
			}
		}
		switch {
		case parent.Err() != nil:
			return nil, parent.Err()
		case l.ctx.Err() != nil:
			return nil, errClosed
		case sess.ctx.Err() != nil:
			return nil, errRequeue
		}
		sleep(ctx, backoff(try))
	}
}

// WatchDelete is the default Waiter: a watch on pred from the revision
// after seen, so it sees a deletion that came before the watch.
type WatchDelete struct{}

func (WatchDelete) WaitDelete(ctx context.Context, cli *clientv3.Client, pred *mvccpb.KeyValue, seen int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range cli.Watch(ctx, string(pred.Key), clientv3.WithRev(seen+1), clientv3.WithFilterPut()) {
		switch {
		case wr.CompactRevision != 0 || Deleted(wr):
			return nil
		case wr.Err() != nil:
			return wr.Err()
		}
	}
	return cmp.Or(ctx.Err(), errors.New("etcdlock: watch closed"))
}

// Deleted reports whether wr tells of a deletion.
func Deleted(wr clientv3.WatchResponse) bool {
	for _, ev := range wr.Events {
		if ev.Type == mvccpb.DELETE {
			return true
		}
	}
	return false
}

// remove deletes our key in the background, fenced by its create revision
// if known, until done or moot: the session's end takes the key with it.
func (l *Locker) remove(sess *session, me string, rev int64) {
	fence := clientv3.Compare(clientv3.CreateRevision(me), "=", rev)
	if rev == 0 {
		fence = clientv3.Compare(clientv3.CreateRevision(me), ">", 0)
	}
	l.goBg(func() {
		for try := 0; ; try++ {
			ctx, cancel := context.WithTimeout(sess.ctx, sess.ttl)
			_, err := l.cli.Txn(ctx).If(fence).Then(clientv3.OpDelete(me)).Commit()
			cancel()
			if err == nil || !sleep(sess.ctx, backoff(try)) {
				return
			}
		}
	})
}

// sleep waits d; false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// backoff is the delay before retry n+1: jittered, from 25 ms to 1 s.
func backoff(n int) time.Duration {
	d := min(25*time.Millisecond<<min(n, 6), time.Second)
	return d/2 + mrand.N(d/2)
}

// hold makes a lease of our key, the oldest in its queue at revision seen.
// Its watch starts after watchDelay: a lease released sooner costs none.
func (l *Locker) hold(sess *session, key, me string, rev, seen int64) (*lease, error) {
	s := &lease{locker: l, sess: sess, key: key, me: me, rev: rev, lost: make(chan struct{}), stopped: make(chan struct{})}
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(sess.ctx))
	s.stopWatch = cancel
	if !l.goBg(func() { s.watch(ctx, seen) }) {
		cancel()
		return nil, errClosed
	}
	return s, nil
}

// lease is our key at the head of its queue.
type lease struct {
	locker   *Locker
	sess     *session
	key, me  string           // the lock's key, our etcd key
	rev      int64            // our key's create revision: the token
	give     func(reuse bool) // hands our name's number back
	lost     chan struct{}
	lostOnce sync.Once
	released atomic.Bool

	stopWatch context.CancelFunc
	stopped   chan struct{} // closed when the watch has ended
}

func (s *lease) Key() string   { return s.key }
func (s *lease) Token() uint64 { return uint64(s.rev) }

// Lost asks the session's renewal too, which reads the clock.
func (s *lease) Lost() <-chan struct{} {
	if !s.released.Load() && isClosed(s.sess.r.Lost()) {
		s.markLost()
	}
	return s.lost
}

func (s *lease) markLost() { s.lostOnce.Do(func() { close(s.lost) }) }

// watch closes Lost when our key is deleted, the watch fails or the session
// ends, unless Release ended it.
func (s *lease) watch(ctx context.Context, seen int64) {
	defer close(s.stopped)
	if sleep(ctx, watchDelay) {
		for wr := range s.locker.cli.Watch(ctx, s.me, clientv3.WithRev(seen+1), clientv3.WithFilterPut()) {
			if wr.Err() != nil || Deleted(wr) {
				break
			}
		}
	}
	if !s.released.Load() {
		s.markLost()
	}
}

// Release deletes our key, a plain delete as concurrency.Mutex's Unlock:
// the name is ours alone (Namer), retried within ctx as create is. Deleted
// == 0: the lease was not held, or, on a retry, an earlier try landed.
func (s *lease) Release(ctx context.Context) error {
	notHeld := fmt.Errorf("release %q: %w", s.key, locking.ErrNotHeld)
	if !s.released.CompareAndSwap(false, true) {
		return notHeld
	}
	s.stopWatch()
	<-s.stopped
	l := s.locker
	if l.ctx.Err() != nil {
		return notHeld // Close revoked the session and deleted the key
	}
	resp, err := l.cli.Delete(ctx, s.me)
	retries := 0
	for ; err != nil && retries < tries-1 && l.ctx.Err() == nil && sleep(ctx, backoff(retries)); retries++ {
		resp, err = l.cli.Delete(ctx, s.me)
	}
	s.give(err == nil && retries == 0) // a failed try may land later
	switch {
	case err != nil:
		// A key left behind would hold the lock as long as the session lives.
		l.remove(s.sess, s.me, s.rev)
		if isClosed(s.lost) {
			return fmt.Errorf("release %q: %w: %w", s.key, locking.ErrNotHeld, err)
		}
		return fmt.Errorf("release %q: %w: %w", s.key, locking.ErrUnavailable, err)
	case resp.Deleted == 0 && retries == 0:
		s.markLost()
		return notHeld
	}
	return nil
}
