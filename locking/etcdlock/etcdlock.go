// Package etcdlock is an etcd lock: keys bound to a lease, served in the
// order of their create revisions, each waiter watching only its
// predecessor (the recipe of etcd's client/v3/concurrency Mutex).
//
// # How it works
//
// A Locker keeps one session: an etcd lease that it renews itself. Acquire
// puts a key <Prefix>/<key>/<lease hex>-<n hex> bound to that lease, where
// n is a number not in use by another acquisition of the session on that
// key, so two goroutines on one Locker never share a key
// (concurrency's Mutex keeps one key per session, which makes them share
// the lock). A number is used again once its key is known deleted and no
// request of ours on it is in flight: a hot key's turns reuse one name, as
// the Mutex does, where a new name per turn left etcd's index a deleted
// entry per turn to walk at every look at the queue until compaction. A
// key with no acquisition of the session under way is forgotten; one that
// retired a number starts its next numbers above it (floorBuckets). The
// key with the lowest create revision under <Prefix>/<key>/ holds the lock;
// any other waits for the deletion of the last key created before its own,
// so a release wakes one waiter (no herd). The uncontended path is one transaction: put our key
// and read the first key in the queue. A waiter's watch starts at the
// current revision and is then checked against the key: etcd serves a watch
// that starts in the past only every 100 ms, which would slow each handoff
// (the concurrency recipe's watch does start in the past).
//
//   - A release retried after a lost reply can never delete a newer
//     holder's key (etcd issue 22082): a name whose delete did not answer
//     at once is never used again in the session, and the cleanups in the
//     background are fenced by ownership, a transaction
//     If(CreateRevision(myKey) == myRev).Then(Delete(myKey)).
//   - The create is idempotent: If(CreateRevision(myKey) == 0).Then(put)
//     .Else(get), so a retry after a lost reply finds the key it made.
//   - Nothing left behind: a wait ended by ctx or a failure deletes its own
//     key. Cleanup never uses the caller's ctx: it runs in the background
//     with fresh bounded contexts, until done, the session ends, or Close;
//     the caller does not wait for it (a cancelled Acquire returns at once).
//     A failed Release goes on
//     deleting in the background the same way, since a key left behind
//     would hold the lock for as long as the session lives.
//
// # Lease lifetime and Lost
//
// The session lease's TTL is Config.TTL rounded up to whole seconds, at
// least 1. etcd raises it to its minimum, 1.5 election timeouts rounded up
// (2 s with default settings); the Locker uses the TTL the server granted.
// A process that dies frees its locks when the lease expires, one TTL after
// its last renewal.
//
// The concurrency package's Session renews through the client's KeepAlive
// stream, whose Done fires only once the client has given up, well after
// the lease may have expired on the server. We renew with KeepAliveOnce
// every TTL/3 through the shared keepalive.Watchdog instead, which knows when
// each renewal was sent: the server's expiry is at least that send time
// plus the TTL, so Lost closes when the send time of the last successful
// renewal plus the TTL minus a drift margin has passed, before the server
// can hand the key to anyone else. A renewal answered "lease not found"
// loses the session at once.
//
// Lost also closes when the lease's key is deleted behind its back, and
// when the session is lost. The deletion is told by a watch on our own key
// that starts once the lease has been held for watchDelay (20 ms), from the
// revision at which the lock was granted, so it misses nothing; a lease
// released sooner (a hot key's usual turn) needs no watch, and Acquire does
// not wait for one. A deletion is told up to watchDelay, plus etcd's 100 ms
// catch-up of watches that start in the past, later than a watch set at
// the grant would tell it. All the Locker's watches share one gRPC stream,
// which one idle watch keeps open. All leases of a Locker
// share its session, so one lost renewal loses them all; the next Acquire
// grants a new session. One session per Locker keeps Acquire at one round
// trip; a session per lease would add a grant and a revoke to each. So
// Release stops the lease's own watch, not the session's renewal, which
// serves the other leases and cannot bring a deleted key back. A lost
// session is revoked in the background (its keys may live on the server)
// until done or one TTL has passed, when the server has surely expired it.
//
// Close revokes every session not yet known revoked: the current one, one
// granted while it closes (it waits for a grant under way, so that the
// session is revoked rather than renewed by nobody), and lost ones whose
// revoke had not landed. It ends the Locker's requests under way, grants
// included, and revokes for at most closeTimeout, so it returns promptly
// even when etcd is unreachable: the leases then expire by their TTL.
//
// # Token
//
// Token is our key's create revision. Revisions grow with every write to
// the cluster, and the queue is served in create-revision order, so each
// later holder has a larger one: a safe fencing token.
//
// # Failure modes
//
// A holder paused past the TTL loses its lease; Lost closes only when it
// runs again, so a write it was about to make must be fenced by the token.
// Jepsen (etcd 3.4.3) showed that etcd locks alone cannot guarantee mutual
// exclusion for this reason: the token is what makes them safe.
package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/internal/background"
	"github.com/oversold-lab/oversold/locking/keepalive"
)

var _ locking.Locker = (*Locker)(nil)

const (
	// DefaultPrefix is the parent of every key's queue when Config.Prefix is "".
	DefaultPrefix = "/oversold/locks"
	// DefaultTTL is the session lease's TTL when Config.TTL is 0.
	DefaultTTL = 10 * time.Second

	// watchDelay is how long a lease is held before it watches its own key
	// (see hold).
	watchDelay = 20 * time.Millisecond
	// tries bounds every retry loop that does not end with a ctx.
	tries = 5
	// closeTimeout bounds Close's revokes: a reachable etcd answers in
	// milliseconds; an unreachable one lets the leases expire by their TTL.
	closeTimeout = 2 * time.Second
)

// Config tunes a Locker. Zero values mean the documented defaults.
type Config struct {
	// TTL is the session lease's time to live, rounded up to whole seconds;
	// 0 = DefaultTTL. The server may raise it to its minimum.
	TTL time.Duration
	// Prefix is the key under which each lock key gets its queue. "" =
	// DefaultPrefix.
	Prefix string
	// OnRenewalFailed, if set, hears every failed renewal of the session
	// lease (metrics). The key is "": one renewal serves every key.
	OnRenewalFailed func(key string, err error)
}

var (
	// errRequeue: our key is gone while we queued (its session ended, or
	// someone deleted it). Acquire queues again, on a new session if needed.
	errRequeue = errors.New("etcdlock: our queue key vanished")
	errClosed  = fmt.Errorf("etcdlock: locker closed: %w", locking.ErrUnavailable)
)

// Locker hands out leases on one etcd session. It is safe for concurrent use.
type Locker struct {
	cli *clientv3.Client
	cfg Config

	grant chan struct{} // one grant of a new session at a time

	bg *background.Group // watchers and cleanups under way; its context ends with Close

	mu        sync.Mutex
	sess      *session              // the current session
	unrevoked map[*session]struct{} // granted, not known revoked or expired: Close revokes them
	closed    bool

	afterGrant  func() // a test's hook between a grant and its publication
	watching    func() // a test's hook as a session's watcher starts
	beforeWatch func() // a test's hook between a waiter's look and its watch
}

// session is one etcd lease, renewed by a keepalive.Watchdog.
type session struct {
	id     clientv3.LeaseID
	ttl    time.Duration // as granted
	ka     *keepalive.Watchdog
	ctx    context.Context // done once the session is lost or closed
	cancel context.CancelFunc

	mu     sync.Mutex
	names  map[string]*names // by queue prefix, while some number is handed out
	floors [floorBuckets]uint64
	seed   maphash.Seed
}

// floorBuckets is how many floors a session keeps. floors[b] is above
// every number retired on a forgotten prefix that hashes to b, and a new
// prefix's numbers start there: an idle prefix is forgotten, so memory
// follows the keys in use (one cancelled Acquire on each of many keys
// kept an entry per key for the session's life), and a retired number
// still never comes back. One floor for the session would move every
// key's next name at each retirement anywhere, so a hot key that goes idle
// between turns would take a new name after each timed-out Acquire on any
// key; with 256, only after one on a key in its bucket.
const floorBuckets = 256

// names numbers a session's queue keys under one prefix: <lease>-<n>. A
// number goes back to free once its key is known deleted with no request
// of ours on it still in flight, and is used again: etcd's index keeps a
// deleted key until compaction, and every look at the queue walks those,
// so a new name per acquisition made each turn on a hot key cost the
// server more than the last (thousands of names between compactions),
// where a reused name is one entry. A number whose key may still be
// written by a request we gave up on is retired for the session's life.
type names struct {
	next    uint64   // never handed out yet from here on
	free    []uint64 // known deleted, nothing in flight
	active  int      // handed out, not yet returned
	retired bool     // some number below next is retired
}

// floor returns pfx's bucket in s.floors.
func (s *session) floor(pfx string) *uint64 {
	return &s.floors[maphash.String(s.seed, pfx)%floorBuckets]
}

// take returns the number of a new queue key under pfx.
func (s *session) take(pfx string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	ns := s.names[pfx]
	if ns == nil {
		ns = &names{next: *s.floor(pfx)}
		s.names[pfx] = ns
	}
	ns.active++
	if k := len(ns.free); k > 0 {
		n := ns.free[k-1]
		ns.free = ns.free[:k-1]
		return n
	}
	ns.next++
	return ns.next - 1
}

// give returns number n under pfx: free for reuse when reuse is set (its
// key is known deleted and no request of ours on it is in flight), else
// retired. A prefix with nothing handed out is forgotten, its free numbers
// with it; if it retired one, its floor first rises to its next, so the
// prefix's numbers start above every number it ever handed out.
func (s *session) give(pfx string, n uint64, reuse bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ns := s.names[pfx]
	ns.active--
	if reuse {
		ns.free = append(ns.free, n)
	} else {
		ns.retired = true
	}
	if ns.active > 0 {
		return
	}
	if ns.retired {
		f := s.floor(pfx)
		*f = max(*f, ns.next)
	}
	delete(s.names, pfx)
}

// alive reports whether the session can still be trusted.
func (s *session) alive() bool {
	select {
	case <-s.ka.Lost():
		return false
	default:
		return s.ctx.Err() == nil
	}
}

// New grants the first session within ctx: that is also the check that etcd
// answers. The Locker uses cli but does not close it.
func New(ctx context.Context, cli *clientv3.Client, cfg Config) (*Locker, error) {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	l := &Locker{cli: cli, cfg: cfg, grant: make(chan struct{}, 1), bg: background.New(), unrevoked: map[*session]struct{}{}}
	if _, err := l.session(ctx); err != nil {
		l.Close()
		return nil, fmt.Errorf("etcdlock: %w", err)
	}
	l.bg.Go(l.keepStream)
	return l, nil
}

// watchCtx is the context of every watch of the Locker: the client runs
// the watches whose contexts carry the same metadata on one gRPC stream.
func (l *Locker) watchCtx(ctx context.Context) context.Context {
	return clientv3.WithRequireLeader(ctx)
}

// keepStream keeps one idle watch open, on a key no lock writes (the prefix
// itself), until Close. The client closes a watch stream with its last
// watch, so without it every acquisition's watch on its own key would open
// a new stream; with it, a watch costs one request on a stream already open.
func (l *Locker) keepStream() {
	for try := 0; ; try++ {
		for range l.cli.Watch(l.watchCtx(l.bg.Context()), l.cfg.Prefix) {
		}
		if !l.bg.Sleep(l.bg.Context(), background.Backoff(try)) {
			return
		}
	}
}

// Close revokes every session not known revoked, which deletes every key
// they hold; held leases are lost. It waits for a grant under way (ended
// by Close), so that a session granted while it closes is revoked too,
// not left renewed by nobody's keepalive, and for the Locker's goroutines,
// whose requests Close ends. Its revokes take at most closeTimeout.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.bg.Close() // ends requests under way; lease watchers mark their leases lost
	l.mu.Unlock()

	l.grant <- struct{}{} // a grant under way publishes its session first
	l.mu.Lock()
	sessions := slices.Collect(maps.Keys(l.unrevoked))
	l.mu.Unlock()
	<-l.grant // later grants see closed

	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	errs := make([]error, len(sessions))
	var wg sync.WaitGroup
	for i, s := range sessions {
		s.ka.Stop()
		s.ka.MarkLost()
		// Even a session lost to us may live on the server until its TTL.
		wg.Go(func() {
			if err := l.revoke(ctx, s); err != nil {
				errs[i] = fmt.Errorf("etcdlock: close: revoke: %w", err)
			}
		})
	}
	wg.Wait()
	l.bg.Wait()
	return errors.Join(errs...)
}

// revoke revokes s's lease, deleting its keys; nil also when the server
// no longer has it. Once revoked, Close need not revoke it again.
func (l *Locker) revoke(ctx context.Context, s *session) error {
	_, err := l.cli.Revoke(ctx, s.id)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return err
	}
	l.forget(s)
	return nil
}

// forget drops s from the sessions Close revokes.
func (l *Locker) forget(s *session) {
	l.mu.Lock()
	delete(l.unrevoked, s)
	l.mu.Unlock()
}

// session returns the live session, granting a new one if the last was lost.
func (l *Locker) session(ctx context.Context) (*session, error) {
	select {
	case l.grant <- struct{}{}:
		defer func() { <-l.grant }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	l.mu.Lock()
	closed, cur := l.closed, l.sess
	l.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	if cur != nil && cur.alive() {
		return cur, nil
	}

	secs := max(int64((l.cfg.TTL+time.Second-1)/time.Second), 1)
	// The client retries an unreachable server until ctx ends: bound it.
	// Close ends it too: a lease granted but never heard of has no keys,
	// and nothing renews it.
	gctx, cancel := context.WithTimeout(ctx, max(l.cfg.TTL, 5*time.Second))
	defer cancel()
	defer context.AfterFunc(l.bg.Context(), cancel)()
	sent := time.Now()
	resp, err := l.cli.Grant(gctx, secs)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case l.bg.Closed():
			return nil, errClosed
		}
		return nil, fmt.Errorf("%w: grant lease: %w", locking.ErrUnavailable, err)
	}
	s := &session{id: resp.ID, ttl: time.Duration(resp.TTL) * time.Second, names: map[string]*names{}, seed: maphash.MakeSeed()}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	var onFail func(error)
	if f := l.cfg.OnRenewalFailed; f != nil {
		onFail = func(err error) { f("", err) }
	}
	s.ka = keepalive.Start(s.ttl, sent, func(ctx context.Context) error {
		_, err := l.cli.KeepAliveOnce(ctx, s.id)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return locking.ErrNotHeld
		}
		return err
	}, onFail)
	if l.afterGrant != nil {
		l.afterGrant()
	}
	// Published even when Close came meanwhile: Close waits for this grant
	// and revokes what it finds in l.unrevoked.
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sess = s
	l.unrevoked[s] = struct{}{}
	if l.closed {
		return nil, errClosed
	}
	watching := l.watching
	l.bg.Go(func() { // not closed: cannot refuse
		if watching != nil {
			watching()
		}
		l.watchSession(s)
	})
	return s, nil
}

// watchSession ends s once its keepalive says it is lost, and revokes the
// lease in case the server still has it, so its keys go now, not in a TTL:
// retried until done, Close (which then revokes it), or one TTL after the
// loss, when the server has surely expired it (no renewal is sent after the
// loss, and one in flight ended with the lease's validity).
func (l *Locker) watchSession(s *session) {
	select {
	case <-s.ka.Lost():
	case <-l.bg.Done():
	}
	s.cancel() // first: the leases' Lost must not wait for the revoke
	if l.bg.Closed() {
		return // Close revokes it
	}
	expired := time.Now().Add(s.ttl)
	l.bg.Remove(func() bool {
		ctx, cancel := context.WithDeadline(l.bg.Context(), expired)
		defer cancel()
		if l.revoke(ctx, s) == nil {
			return true
		}
		if time.Now().After(expired) {
			l.forget(s)
			return true
		}
		return false
	})
}

// Acquire queues for key and waits for its turn, ctx, or a failure.
func (l *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if key == "" {
		return nil, errors.New(`acquire "": empty key`)
	}
	pfx := l.queue(key)
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

// queue is the prefix of key's queue.
func (l *Locker) queue(key string) string {
	return l.cfg.Prefix + "/" + url.PathEscape(key) + "/"
}

func (l *Locker) acquire(ctx context.Context, key, pfx string) (*lease, error) {
	sess, err := l.session(ctx)
	if err != nil {
		return nil, err
	}
	n := sess.take(pfx)
	me := pfx + strconv.FormatInt(int64(sess.id), 16) + "-" + strconv.FormatUint(n, 16)
	q, err := l.enqueue(ctx, sess, pfx, me)
	if err != nil {
		sess.give(pfx, n, false) // the cleanup's requests are in flight
		return nil, err
	}
	s, err := l.wait(ctx, sess, key, pfx, me, q)
	if err != nil {
		sess.give(pfx, n, false)
		l.bg.Go(func() { l.remove(ctx, sess, me, q.rev) })
		return nil, err
	}
	s.pfx, s.n = pfx, n
	return s, nil
}

// queued is our place in the queue.
type queued struct {
	rev   int64 // our key's create revision
	first bool  // ours is the oldest key: we hold the lock
	seen  int64 // the revision at which that was read
}

// enqueue puts our key and reads the head of the queue in one transaction.
// The transaction is never abandoned halfway, since it may still land on the
// server: it runs with its own bounded context, and when ctx ends first, the
// cleanup waits for it and deletes what it made.
func (l *Locker) enqueue(ctx context.Context, sess *session, pfx, me string) (queued, error) {
	type result struct {
		q   queued
		err error
	}
	res := make(chan result, 1)
	if !l.bg.Go(func() {
		q, err := l.create(context.WithoutCancel(ctx), sess, pfx, me)
		res <- result{q, err}
	}) {
		return queued{}, errClosed
	}
	select {
	case r := <-res:
		if r.err != nil {
			l.bg.Go(func() { l.remove(ctx, sess, me, 0) })
		}
		return r.q, r.err
	case <-ctx.Done():
		l.bg.Go(func() {
			r := <-res
			l.remove(ctx, sess, me, r.q.rev)
		})
		return queued{}, ctx.Err()
	}
}

// create runs the idempotent create transaction, retrying when its outcome
// is unknown, within the session's TTL.
func (l *Locker) create(ctx context.Context, sess *session, pfx, me string) (queued, error) {
	ctx, cancel := context.WithTimeout(ctx, sess.ttl)
	defer cancel()
	defer context.AfterFunc(l.bg.Context(), cancel)()
	head := clientv3.OpGet(pfx, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)
	var err error
	for try := range tries {
		var resp *clientv3.TxnResponse
		resp, err = l.cli.Txn(ctx).
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
			return q, nil
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			sess.ka.MarkLost() // the next session() grants a new one
			return queued{}, errRequeue
		case l.bg.Closed():
			return queued{}, errClosed
		case ctx.Err() != nil:
			return queued{}, fmt.Errorf("%w: %w", locking.ErrUnavailable, err)
		}
		if !l.bg.Sleep(ctx, background.Backoff(try)) {
			break
		}
	}
	return queued{}, fmt.Errorf("%w: %w", locking.ErrUnavailable, err)
}

// wait waits until ours is the oldest key in the queue, watching only the
// key created just before ours.
func (l *Locker) wait(parent context.Context, sess *session, key, pfx, me string, q queued) (*lease, error) {
	if q.first {
		return l.hold(sess, key, me, q.rev, q.seen)
	}
	// Stop waiting when the session ends, or the Locker closes, too.
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	defer context.AfterFunc(sess.ctx, cancel)()
	defer context.AfterFunc(l.bg.Context(), cancel)()

	var failing time.Time // since when requests fail: etcd unreachable
	for try := 0; ; try++ {
		// One snapshot: the last key created before ours, and ours.
		resp, err := l.cli.Txn(ctx).Then(
			clientv3.OpGet(pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(q.rev-1), clientv3.WithKeysOnly())...),
			clientv3.OpGet(me, clientv3.WithKeysOnly()),
		).Commit()
		if err == nil {
			failing = time.Time{}
			if len(resp.Responses[1].GetResponseRange().Kvs) == 0 {
				return nil, errRequeue
			}
			pred := resp.Responses[0].GetResponseRange().Kvs
			if len(pred) == 0 {
				return l.hold(sess, key, me, q.rev, resp.Header.Revision)
			}
			if l.beforeWatch != nil {
				l.beforeWatch()
			}
			if err = l.waitDelete(ctx, pred[0]); err == nil {
				continue
			}
		}
		switch {
		case parent.Err() != nil:
			return nil, parent.Err()
		case sess.ctx.Err() != nil:
			return nil, errRequeue
		case l.bg.Closed():
			return nil, errClosed
		}
		if failing.IsZero() {
			failing = time.Now()
		} else if time.Since(failing) > sess.ttl {
			return nil, fmt.Errorf("%w: %w", locking.ErrUnavailable, err)
		}
		l.bg.Sleep(ctx, background.Backoff(try))
	}
}

// waitDelete waits until pred, the key as created at its create revision,
// is deleted. A nil return means "look again": it went, or the watch was
// compacted away.
//
// The watch starts at the current revision rather than at the snapshot's:
// etcd serves a watch that starts in the past from a loop that runs every
// 100 ms (mvcc's unsynced watchers), which would delay every handoff. So we
// wait until the watch is in place, then check that the key is still there:
// a deletion before that check is seen by the check, one after it by the
// watch. The check compares the create revision: a name is used again once
// deleted, and a later key of that name is behind ours in the queue
// (waiting for its deletion would wait for ourselves).
func (l *Locker) waitDelete(ctx context.Context, pred *mvccpb.KeyValue) error {
	key := string(pred.Key)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := l.cli.Watch(l.watchCtx(ctx), key, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
	for wr := range wch {
		switch {
		case wr.CompactRevision != 0:
			return nil
		case wr.Err() != nil:
			return wr.Err()
		case wr.Created:
			resp, err := l.cli.Get(ctx, key, clientv3.WithKeysOnly())
			if err != nil {
				return err
			}
			if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != pred.CreateRevision {
				return nil
			}
		case deleted(wr):
			return nil
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("etcdlock: watch closed")
}

// hold makes a lease of our key, now the oldest in its queue, read at
// revision seen. Lost closes when the session ends or the Locker closes
// (context.AfterFunc, no goroutine), and when our key is deleted behind our
// back, which a watch on the key tells. That watch starts only once the
// lease has been held for watchDelay, and from revision seen+1, so it still
// sees a deletion that came before it: a lease released sooner, the common
// case on a hot key, costs no watch at all (a watch is a request the client
// waits for, and a new gRPC stream when none is open).
func (l *Locker) hold(sess *session, key, me string, rev, seen int64) (*lease, error) {
	if l.bg.Closed() {
		return nil, errClosed
	}
	s := &lease{locker: l, sess: sess, key: key, me: me, rev: rev, lost: make(chan struct{})}
	s.unlost = []func() bool{context.AfterFunc(sess.ctx, s.markLost), context.AfterFunc(l.bg.Context(), s.markLost)}
	s.timer = time.AfterFunc(watchDelay, func() { s.startWatch(seen) })
	return s, nil
}

// startWatch starts the watch on our key, unless Release came first.
func (s *lease) startWatch(seen int64) {
	l := s.locker
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	ctx, cancel := context.WithCancel(l.watchCtx(context.Background()))
	stopped := make(chan struct{})
	if !l.bg.Go(func() {
		defer close(stopped)
		defer cancel()
		// Watch waits for the server: the end of the session or of the
		// Locker ends that wait too (and Lost closes then anyway).
		defer context.AfterFunc(s.sess.ctx, cancel)()
		defer context.AfterFunc(l.bg.Context(), cancel)()
		s.watch(l.cli.Watch(ctx, s.me, clientv3.WithRev(seen+1), clientv3.WithFilterPut()))
	}) {
		cancel()
		return // closed: Lost closes by the Locker's ctx
	}
	s.cancel, s.stopped = cancel, stopped
}

// remove deletes our key in the background (fenced by its create revision
// when known; the name is ours alone either way), until it is gone, the
// session is (the lease expires or is revoked, and our key with it), or the
// Locker closes. Each try has a fresh context that keeps only ctx's
// values, bounded by the session's TTL and ended by Close.
func (l *Locker) remove(ctx context.Context, sess *session, me string, rev int64) {
	cmp := clientv3.Compare(clientv3.CreateRevision(me), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(me), ">", 0)
	}
	l.bg.Remove(func() bool {
		if sess.ctx.Err() != nil {
			return true
		}
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sess.ttl)
		defer cancel()
		defer context.AfterFunc(l.bg.Context(), cancel)() // Close does not wait for it
		_, err := l.cli.Txn(tctx).If(cmp).Then(clientv3.OpDelete(me)).Commit()
		return err == nil
	})
}

// releaseFailed is the error of a Release that could not reach etcd: the
// lease is not held if it was lost already, else its fate is unknown.
func releaseFailed(key string, lost <-chan struct{}, err error) error {
	select {
	case <-lost:
		return fmt.Errorf("release %q: %w: %w", key, locking.ErrNotHeld, err)
	default:
		return fmt.Errorf("release %q: %w: %w", key, locking.ErrUnavailable, err)
	}
}

// lease is our key at the head of its queue.
type lease struct {
	locker *Locker
	sess   *session
	key    string
	me     string // our etcd key
	rev    int64  // its create revision: the token
	pfx    string // our queue's prefix
	n      uint64 // the number in our key's name

	lost     chan struct{}
	lostOnce sync.Once
	unlost   []func() bool // stop the AfterFuncs that close lost
	timer    *time.Timer   // starts the watch on our key
	released atomic.Bool

	mu      sync.Mutex
	ended   bool               // Release began: no watch starts, a watch ending is no loss
	cancel  context.CancelFunc // ends the watch on our key, once started
	stopped chan struct{}      // closed when the watcher has ended
}

func (s *lease) Key() string   { return s.key }
func (s *lease) Token() uint64 { return uint64(s.rev) }

// Lost asks the session's keepalive itself, which reads the clock: after a
// pause, the first look must not race the goroutines that close s.lost.
func (s *lease) Lost() <-chan struct{} {
	if !s.released.Load() {
		select {
		case <-s.sess.ka.Lost():
			s.markLost()
		default:
		}
	}
	return s.lost
}

func (s *lease) markLost() { s.lostOnce.Do(func() { close(s.lost) }) }

// watch closes Lost when our key is deleted, or when the watch fails or
// ends (ownership unknown counts as lost), unless Release ended it.
func (s *lease) watch(wch clientv3.WatchChan) {
	for wr := range wch {
		if wr.Err() != nil || deleted(wr) {
			break
		}
	}
	s.mu.Lock()
	ended := s.ended
	s.mu.Unlock()
	if !ended {
		s.markLost()
	}
}

func deleted(wr clientv3.WatchResponse) bool {
	for _, ev := range wr.Events {
		if ev.Type == mvccpb.DELETE {
			return true
		}
	}
	return false
}

// Release deletes our key. Its name (session lease and number) is used
// again only after a delete of it answered at the first try, with no
// request of ours on it left in flight (names), so a plain delete, as
// concurrency.Mutex's Unlock, can only remove our own claim, retried or
// not: no compare on its create revision is needed, and none is paid for
// (a Txn costs the server more than a DeleteRange). Deleted == 0 on a
// first try: the key went already.
func (s *lease) Release(ctx context.Context) error {
	notHeld := func() error { return fmt.Errorf("release %q: %w", s.key, locking.ErrNotHeld) }
	if !s.released.CompareAndSwap(false, true) {
		return notHeld()
	}
	s.mu.Lock()
	s.ended = true
	s.timer.Stop()
	cancel, stopped := s.cancel, s.stopped
	s.mu.Unlock()
	for _, stop := range s.unlost {
		stop()
	}
	if cancel != nil {
		cancel()
		<-stopped
	}
	l := s.locker
	if l.bg.Closed() {
		return notHeld() // Close revoked the session and deleted the key
	}
	retried := false
	for try := 0; ; try++ {
		resp, err := l.cli.Delete(ctx, s.me)
		if err == nil || ctx.Err() != nil || try == tries-1 || l.bg.Closed() {
			// Reused only when this first delete answered: a failed one
			// may still land, on a later key of the same name.
			s.sess.give(s.pfx, s.n, err == nil && !retried)
		}
		switch {
		case err == nil && (resp.Deleted == 1 || retried):
			return nil // on a retry, "not there" means our first delete landed
		case err == nil:
			s.markLost()
			return notHeld()
		case ctx.Err() != nil, try == tries-1, l.bg.Closed():
			// Stop waiting, not deleting: a key left behind would hold the
			// lock for as long as the session lives.
			l.bg.Go(func() { l.remove(ctx, s.sess, s.me, s.rev) })
			return releaseFailed(s.key, s.lost, err)
		}
		retried = true
		l.bg.Sleep(ctx, background.Backoff(try))
	}
}
