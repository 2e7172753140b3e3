// Package zklock is a ZooKeeper lock: ephemeral sequential nodes in a queue,
// each waiter watching only its predecessor (the ZooKeeper lock recipe, as
// in Apache Curator's InterProcessMutex).
//
// # How it works
//
// Each key has a container node under Config.Root, /oversold/locks/<key>
// (the key path-escaped, so "sku/1" is one node). Acquire creates an
// ephemeral sequential child _c_<guid>-lock-<seq> in it and lists the
// children: the lowest sequence holds the lock. Anyone else sets a watch on
// the child just below its own and sleeps until that child goes, so a
// release wakes exactly one waiter (no herd). Release deletes the node.
// A grant costs no request of its own: the token comes with the listing
// (below), and the watch on our own node that drives Lost is set only once
// the lease has been held for watchDelay (20 ms). So a free lock costs the
// create and the listing, and a hot key's turn a create, a listing and a
// delete: the bare recipe's requests, no more.
//
//   - Protected create (Curator's protection mode): the node name carries a
//     fresh GUID. When a create's reply is lost to a disconnect, the create
//     may or may not have happened; we list the children and look for our
//     GUID before creating again, so a lost reply never leaves a second,
//     orphaned node that would hold the key forever.
//   - Nothing left behind: a wait ended by ctx, or that fails, deletes its
//     own node (Curator does; go-zookeeper's Lock leaves it). Cleanup never
//     uses the caller's ctx: it runs in the background, retrying until the
//     node is gone, its session is, or Close, and the caller does not wait
//     for it (a cancelled Acquire returns at once). A Release that cannot
//     reach the server keeps deleting in the background the same way.
//   - Parents are container nodes (ZooKeeper 3.5+, as Curator makes them),
//     which the server removes once their last child is gone (checked every
//     znode.container.checkIntervalMs, a minute by default), so keys leave
//     no litter. A create racing that removal sees NoNode and makes the
//     parent again.
//
// # Lease lifetime and Lost
//
// The Locker owns its ZooKeeper session: New dials the servers itself. It
// has to, because the session is the lease: the session timeout is the TTL,
// the session events must reach the Locker from the first connect, and the
// negotiated timeout is only visible at connect time (go-zookeeper has no
// getter for it; we read it from the line it logs after every handshake, so
// a server that clamps the requested timeout is honoured). A process that
// dies frees its locks when the server expires its session, one session
// timeout after its last contact.
//
// Lost closes when the holder can no longer vouch for the lease:
//   - at once, when the session expires (go-zookeeper then reconnects with a
//     NEW session, so every lease of the old one is lost), or when a check
//     finds the node gone;
//   - when the node is deleted behind our back: told by a watch on our own
//     node, set once the lease has been held for watchDelay; a deletion
//     before that is found when the watch is set, so Lost closes at most
//     watchDelay plus a round trip after it;
//   - when no request has succeeded for the session timeout minus a drift
//     margin, counted from the send time of the last successful check: a
//     disconnect that long means ownership is unknown, and the server may
//     expire the session at that moment. The shared keepalive.Watchdog
//     checks (Sync, then Exists on our node, every timeout/3) and keeps
//     this clock.
//
// The check syncs through the leader before it reads: a follower cut off
// from the quorum goes on answering its clients' reads and pings from its
// own copy until it gives up on the leader (syncLimit ticks), while the
// leader, which no longer hears of our session, expires it and grants the
// lock to the next waiter. A read alone would then keep Lost open beside
// the new holder (the lab's zk-follower-partition shows it); a sync cannot
// complete without the leader, so the check fails and Lost closes in time.
//
// All leases of a Locker share its session: one expiry loses them all.
//
// # Token
//
// Token is the parent's pzxid in the listing that granted the lock: the zxid
// of the last creation or deletion of a child the server had applied.
// Zxids grow across the whole ensemble, and every server applies them in
// order. That listing shows our node, so the server had not yet applied its
// deletion: every zxid it had applied, ours included, is below that
// deletion's. The next holder's granting listing no longer shows our node
// (it is first), so its pzxid is at least that deletion's zxid: strictly
// above our token, on any server, and even when the parent was removed and
// made again in between (which resets sequence numbers, but comes after our
// deletion and before the next child). It is a safe fencing token, read in
// the listing the recipe makes anyway, where our node's own czxid would
// cost a request of its own (go-zookeeper has no Create2).
//
// # Failure modes
//
// A holder paused longer than the session timeout (GC, SIGSTOP) loses its
// session; Lost closes only when it runs again, so a write it was about to
// make must be fenced by the token. A partitioned holder's Lost closes
// before the server can expire its session (given clocks that drift less
// than 1%), while a majority side grants the key to the next waiter only
// after expiry.
package zklock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/internal/background"
	"github.com/oversold-lab/oversold/locking/keepalive"
)

var _ locking.Locker = (*Locker)(nil)

const (
	// DefaultRoot is the parent of every key's node when Config.Root is "".
	DefaultRoot = "/oversold/locks"
	// DefaultSessionTimeout is the session timeout when Config.SessionTimeout is 0.
	DefaultSessionTimeout = 10 * time.Second

	protectedPrefix = "_c_" // Curator's marker for a protected node
	lockSuffix      = "-lock-"

	// tries bounds every retry loop that does not end with a ctx.
	tries = 5
)

// Config tunes a Locker. Zero values mean the documented defaults.
type Config struct {
	// SessionTimeout is the lease's time to live: a holder that dies frees
	// its locks this long after its last contact. 0 = DefaultSessionTimeout.
	// The server clamps it to its [minSessionTimeout, maxSessionTimeout];
	// the Locker uses the timeout the server granted.
	SessionTimeout time.Duration
	// Root is the node under which each key gets its queue. "" = DefaultRoot.
	Root string
	// Logger receives the ZooKeeper client's messages at debug level.
	// nil = slog.Default().
	Logger *slog.Logger
	// OnRenewalFailed, if set, hears every failed ownership check (metrics).
	OnRenewalFailed func(key string, err error)
	// Dialer opens connections to the servers (a proxy, TLS). nil =
	// net.DialTimeout.
	Dialer zk.Dialer
}

// errVanished: our queue node is gone while we waited (the session expired,
// or someone deleted it). Acquire queues again.
var errVanished = errors.New("zklock: our queue node vanished")

// errClosed is returned by a Locker after Close.
var errClosed = fmt.Errorf("zklock: locker closed: %w", locking.ErrUnavailable)

var acl = zk.WorldACL(zk.PermAll)

// Locker hands out leases backed by one ZooKeeper session. It is safe for
// concurrent use.
type Locker struct {
	cfg  Config
	log  *slog.Logger
	conn *zk.Conn

	timeout   atomic.Int64  // negotiated session timeout, in ns
	connected chan struct{} // closed once the first session's timeout is known
	connOnce  sync.Once
	drained   chan struct{} // closed when go-zookeeper closes its event channel: its goroutines are gone

	bg *background.Group // requests and cleanups under way

	mu     sync.Mutex
	leases map[string]*lease // held leases by node path
	closed bool
}

// New connects to the servers and waits, within ctx, for a session. The
// Locker owns the connection and closes it in Close: see the package doc
// for why it cannot share a caller's *zk.Conn.
func New(ctx context.Context, servers []string, cfg Config) (*Locker, error) {
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	if cfg.Root == "" {
		cfg.Root = DefaultRoot
	}
	cfg.Root = strings.TrimRight(cfg.Root, "/")
	if !strings.HasPrefix(cfg.Root, "/") {
		return nil, fmt.Errorf("zklock: root %q is not an absolute path", cfg.Root)
	}
	l := &Locker{
		cfg:       cfg,
		log:       cfg.Logger,
		connected: make(chan struct{}),
		drained:   make(chan struct{}),
		leases:    make(map[string]*lease),
		bg:        background.New(),
	}
	if l.log == nil {
		l.log = slog.Default()
	}
	l.timeout.Store(int64(cfg.SessionTimeout))
	dial := cfg.Dialer
	if dial == nil {
		dial = net.DialTimeout
	}
	conn, events, err := zk.Connect(servers, cfg.SessionTimeout, zk.WithDialer(dial),
		zk.WithEventCallback(l.onEvent), zk.WithLogger(zkLogger{l}), zk.WithLogInfo(true))
	if err != nil {
		return nil, fmt.Errorf("zklock: connect %v: %w", servers, err)
	}
	l.conn = conn
	// The callback sees every event; the channel only tells us when the
	// connection's goroutines have ended. It drops events when full, but
	// drain it anyway, as go-zookeeper asks.
	go func() {
		for range events {
		}
		close(l.drained)
	}()

	// go-zookeeper retries unreachable servers forever: bound the wait.
	wait := max(cfg.SessionTimeout, 5*time.Second)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	select {
	case <-l.connected:
		return l, nil
	case <-ctx.Done():
		l.Close()
		return nil, fmt.Errorf("zklock: no session with %v: %w", servers, ctx.Err())
	}
}

// SessionTimeout is the session timeout the server granted: the TTL of
// every lease.
func (l *Locker) SessionTimeout() time.Duration { return time.Duration(l.timeout.Load()) }

// Close ends the session, which deletes every node it holds; held leases
// are lost. It waits for the connection's and the Locker's goroutines.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	held := make([]*lease, 0, len(l.leases))
	for _, s := range l.leases {
		held = append(held, s)
	}
	clear(l.leases)
	l.mu.Unlock()
	l.bg.Close()

	for _, s := range held {
		s.ka.Stop()
		s.ka.MarkLost()
	}
	l.conn.Close()
	<-l.drained
	l.bg.Wait()
	return nil
}

// Acquire queues for key and waits for its turn, ctx, or a failure.
func (l *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if key == "" {
		return nil, errors.New(`acquire "": empty key`)
	}
	parent := l.cfg.Root + "/" + escape(key)
	var err error
	for range tries {
		var s *lease
		if s, err = l.acquire(ctx, key, parent); err == nil {
			return s, nil
		}
		if !errors.Is(err, errVanished) {
			break
		}
	}
	return nil, locking.AcquireError(ctx, key, err)
}

// acquire queues on a goroutine of the Locker's background group and waits
// for its outcome or ctx. go-zookeeper's requests take no ctx: a cancelled
// Acquire returns at once and leaves that goroutine to finish the request
// under way and clean up after it. The whole queueing runs there, so an
// acquisition hands over once, not once per request (a hand-over is a
// wake-up of another goroutine, paid again at every handoff).
func (l *Locker) acquire(ctx context.Context, key, parent string) (*lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	type result struct {
		s   *lease
		err error
	}
	res := make(chan result) // unbuffered: handed only to a caller still waiting
	if !l.bg.Go(func() {
		s, err := l.queue(ctx, key, parent)
		select {
		case res <- result{s, err}:
		case <-ctx.Done():
			if s != nil { // granted as the caller gave up: nobody holds it
				rctx, cancel := context.WithTimeout(context.Background(), l.SessionTimeout())
				s.Release(rctx)
				cancel()
			}
		}
	}) {
		return nil, errClosed
	}
	select {
	case r := <-res:
		return r.s, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// queue creates our node and waits for our turn; it runs on a background
// goroutine (acquire). What it leaves behind on failure or ctx is removed.
func (l *Locker) queue(ctx context.Context, key, parent string) (*lease, error) {
	path, session, err := l.enqueue(ctx, parent)
	if err != nil {
		return nil, err
	}
	s, err := l.wait(ctx, key, parent, path, session)
	if err != nil && !errors.Is(err, errVanished) {
		l.bg.Go(func() { l.remove(path, session) })
	}
	return s, err
}

// enqueue creates our node and returns its path and the session that owns it.
// A create ended by ctx or by a failure is cleaned up: the create itself is
// never abandoned halfway, since it may still land on the server.
func (l *Locker) enqueue(ctx context.Context, parent string) (string, int64, error) {
	guid := newGUID()
	path, session, err := l.create(parent, guid)
	switch {
	case err != nil:
		l.bg.Go(func() { l.removeGUID(parent, guid) })
		if !errors.Is(err, locking.ErrUnavailable) && !errors.Is(err, errVanished) {
			err = fmt.Errorf("%w: create: %w", locking.ErrUnavailable, err)
		}
		return "", 0, err
	case ctx.Err() != nil:
		l.bg.Go(func() { l.remove(path, session) })
		return "", 0, ctx.Err()
	}
	return path, session, nil
}

// create makes our ephemeral sequential node, protected by guid, and
// returns its path and the session that owns it: the one the connection had
// when the create (or the look that found the node) was sent. If the
// session changed before the answer was read, the node may have died with
// the old one while a follower still lists it, and a lease recorded under
// the new session would pass its session check: errVanished, create again.
func (l *Locker) create(parent, guid string) (string, int64, error) {
	prefix := parent + "/" + protectedPrefix + guid + lockSuffix
	search := false // a create's outcome is unknown: look before creating again
	var err error
	// owned returns path as session's, if the connection still has it.
	owned := func(path string, session int64) (string, int64, error) {
		if hook := afterCreate.Load(); hook != nil {
			(*hook)(path)
		}
		if l.conn.SessionID() != session {
			return "", 0, errVanished
		}
		return path, session, nil
	}
	// A lost connection is retried for as long as wait retries its looks:
	// the session either comes back within its timeout or expires.
	var failing time.Time
	for try := 0; try < tries || time.Since(failing) <= l.SessionTimeout(); try++ {
		if search {
			var path string
			session := l.conn.SessionID()
			if path, err = l.find(parent, guid); err == nil && path != "" {
				return owned(path, session)
			}
			if err == nil {
				search = false
			}
		}
		if !search {
			var path string
			session := l.conn.SessionID()
			path, err = l.conn.Create(prefix, nil, zk.FlagEphemeral|zk.FlagSequence, acl)
			switch {
			case err == nil:
				return owned(path, session)
			case errors.Is(err, zk.ErrNoNode):
				// No parent yet, or a container the server just removed.
				err = l.makePath(parent)
			case errors.Is(err, zk.ErrSessionExpired):
				// A node of the expired session is gone with it: create
				// again once the connection has its new session.
			case ambiguous(err):
				search = true
			}
		}
		switch {
		case err == nil:
			continue
		case l.bg.Closed():
			return "", 0, errClosed
		case !ambiguous(err) && !errors.Is(err, zk.ErrSessionExpired):
			return "", 0, err
		}
		if failing.IsZero() {
			failing = time.Now()
		}
		if !l.bg.Sleep(context.Background(), background.Backoff(try)) {
			return "", 0, errClosed
		}
	}
	if err == nil { // the parent kept vanishing
		err = zk.ErrNoNode
	}
	return "", 0, err
}

// afterCreate, set only by tests, runs where create has its node and is
// about to check that its session is still the connection's.
var afterCreate atomic.Pointer[func(path string)]

// makePath creates path and its missing ancestors as container nodes.
func (l *Locker) makePath(path string) error {
	var err error
	for range tries {
		_, err = l.conn.CreateContainer(path, nil, zk.FlagContainer, acl)
		if err == nil || errors.Is(err, zk.ErrNodeExists) {
			return nil
		}
		if !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		dir := path[:strings.LastIndexByte(path, '/')]
		if dir == "" {
			return err
		}
		if err = l.makePath(dir); err != nil {
			return err
		}
	}
	return err
}

// find returns the path of our node (by guid) under parent, or "".
func (l *Locker) find(parent, guid string) (string, error) {
	children, _, err := l.conn.Children(parent)
	if errors.Is(err, zk.ErrNoNode) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	for _, c := range children {
		if strings.HasPrefix(c, protectedPrefix+guid) {
			return parent + "/" + c, nil
		}
	}
	return "", nil
}

// wait waits until our node is the lowest in the queue, watching only the
// node just below it. It runs on a background goroutine (acquire), so its
// requests wait for their answers there.
func (l *Locker) wait(ctx context.Context, key, parent, path string, session int64) (*lease, error) {
	name := path[len(parent)+1:]
	seq, ok := sequence(name)
	if !ok {
		return nil, fmt.Errorf("zklock: unexpected node name %q", name)
	}
	var (
		failing time.Time // since when requests fail: ZooKeeper unreachable
		sent    time.Time // when the last look at the queue was sent
		pzxid   int64     // the parent's at the last look: the token (grant)
	)
	for try := 0; ; try++ {
		sent = time.Now()
		err := func() error {
			if err := ctx.Err(); err != nil {
				return err
			}
			children, st, err := l.conn.Children(parent)
			if err != nil {
				return err
			}
			pzxid = st.Pzxid
			pred, mine := predecessor(children, name, seq)
			if !mine {
				return errVanished
			}
			if pred == "" {
				return nil // our turn
			}
			_, _, gone, err := l.conn.GetW(parent + "/" + pred)
			if errors.Is(err, zk.ErrNoNode) {
				return errRetry // went while we looked
			}
			if err != nil {
				return err
			}
			failing = time.Time{}
			select {
			case <-gone:
				return errRetry
			case <-ctx.Done():
				return ctx.Err()
			case <-l.bg.Done():
				return errClosed
			}
		}()
		switch {
		case err == nil:
			// The session answered the look sent at sent: the lease's
			// validity runs from then.
			return l.grant(key, path, session, sent, pzxid)
		case errors.Is(err, errRetry):
			continue
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, errVanished), errors.Is(err, errClosed):
			return nil, err
		case errors.Is(err, zk.ErrNoNode): // the parent is gone, so is our node
			return nil, errVanished
		}
		if failing.IsZero() {
			failing = time.Now()
		} else if time.Since(failing) > l.SessionTimeout() {
			return nil, fmt.Errorf("%w: %w", locking.ErrUnavailable, err)
		}
		if !l.bg.Sleep(ctx, background.Backoff(try)) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, errClosed
		}
	}
}

var errRetry = errors.New("zklock: look again")

// grant turns our node, now first in the queue, into a lease whose token
// is pzxid, read in the listing that found our node first (see Token), and
// whose validity runs from sent, a request the session answered. It costs
// no request: a hot key's turn is a create, a listing and a delete, as the
// bare recipe's. The watch on our own node that tells a deletion behind
// our back is set only once the lease has been held for watchDelay (watch).
func (l *Locker) grant(key, path string, session int64, sent time.Time, pzxid int64) (*lease, error) {
	s := &lease{locker: l, key: key, path: path, session: session, token: uint64(pzxid)}
	var onFail func(error)
	if f := l.cfg.OnRenewalFailed; f != nil {
		onFail = func(err error) { f(key, err) }
	}
	s.ka = keepalive.Start(trusted(l.SessionTimeout()), sent, s.check, onFail)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		s.ka.Stop()
		return nil, errClosed
	}
	l.leases[path] = s
	l.mu.Unlock()
	// Registered first, so an expiry from now on reaches it; one before is
	// caught here.
	if l.conn.SessionID() != s.session {
		s.ka.MarkLost()
	}
	s.watchTimer = time.AfterFunc(watchDelay, s.watch)
	return s, nil
}

// watchDelay is how long a lease is held before it watches its own node.
// Most leases of a hot key are released sooner, and so cost no watch: the
// request, and the event its deletion sends back. A deletion behind our back
// within watchDelay is told when the watch is set, which finds the node
// gone.
const watchDelay = 20 * time.Millisecond

// watch sets a watch on our node (GetW: it sets none on a node that is
// gone), whose deletion event onEvent turns into Lost; a node already gone
// is lost at once. Nothing once Release began.
func (s *lease) watch() {
	l := s.locker
	l.bg.Go(func() {
		if s.released.Load() {
			return
		}
		_, _, _, err := l.conn.GetW(s.path)
		if errors.Is(err, zk.ErrNoNode) && !s.released.Load() {
			s.ka.MarkLost()
		}
		// Any other failure: the keepalive's checks decide.
	})
}

// onEvent hears every go-zookeeper event, on its goroutines: it must not
// block, nor call the connection.
func (l *Locker) onEvent(ev zk.Event) {
	switch {
	case ev.Type == zk.EventSession && ev.State == zk.StateExpired:
		// The session of every lease held is gone; go-zookeeper is about to
		// open a new one.
		l.mu.Lock()
		for _, s := range l.leases {
			s.ka.MarkLost()
		}
		l.mu.Unlock()
	case ev.Type == zk.EventNodeDeleted, ev.Type == zk.EventNotWatching:
		// Our node deleted, or its watch dropped (session expired, closing).
		l.mu.Lock()
		if s := l.leases[ev.Path]; s != nil {
			s.ka.MarkLost()
		}
		l.mu.Unlock()
	}
}

// remove deletes a node of ours in the background, until it is gone, its
// session is (an ephemeral node ends with its session), or the Locker
// closes.
func (l *Locker) remove(path string, session int64) {
	l.bg.Remove(func() bool {
		if l.conn.SessionID() != session {
			return true
		}
		err := l.conn.Delete(path, -1)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			l.log.Debug("zklock: delete failed", "path", path, "err", err)
			return false
		}
		return true
	})
}

// removeGUID deletes our node after a create whose outcome is unknown.
func (l *Locker) removeGUID(parent, guid string) {
	l.bg.Remove(func() bool {
		session := l.conn.SessionID()
		path, err := l.find(parent, guid)
		if err != nil {
			return false
		}
		if path != "" {
			l.remove(path, session)
		}
		return true
	})
}

// call runs a go-zookeeper request until it answers or ctx ends. The client
// takes no context; an abandoned request still ends on its own (answered,
// failed by a disconnect, or by Close), and Close waits for it.
func call[T any](ctx context.Context, l *Locker, op func() (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	type result struct {
		v   T
		err error
	}
	res := make(chan result, 1)
	if !l.bg.Go(func() {
		v, err := op()
		res <- result{v, err}
	}) {
		return zero, errClosed
	}
	select {
	case r := <-res:
		return r.v, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// ambiguous reports whether a request may have been applied although it
// failed: the connection broke before its reply came.
func ambiguous(err error) bool {
	for _, definite := range []error{
		zk.ErrNoNode, zk.ErrNodeExists, zk.ErrNoAuth, zk.ErrBadVersion, zk.ErrInvalidACL,
		zk.ErrNoChildrenForEphemerals, zk.ErrNotEmpty, zk.ErrBadArguments, zk.ErrInvalidPath,
		zk.ErrInvalidFlags, zk.ErrAPIError, zk.ErrSessionExpired,
	} {
		if errors.Is(err, definite) {
			return false
		}
	}
	return true
}

// predecessor returns the queue node just below ours (seq), "" when ours is
// the lowest, and whether ours is still in the queue.
func predecessor(children []string, name string, seq int64) (pred string, mine bool) {
	best := int64(-1)
	for _, c := range children {
		if c == name {
			mine = true
			continue
		}
		if n, ok := sequence(c); ok && n < seq && n > best {
			pred, best = c, n
		}
	}
	return pred, mine
}

// sequence parses the server's sequence suffix of a queue node's name.
func sequence(name string) (int64, bool) {
	i := strings.LastIndex(name, lockSuffix)
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(name[i+len(lockSuffix):], 10, 64)
	return n, err == nil
}

// escape makes key one path segment: '/' and anything ZooKeeper refuses in
// a path become %XX, and so do dots ("." and ".." are not node names).
func escape(key string) string {
	return strings.ReplaceAll(url.PathEscape(key), ".", "%2E")
}

func newGUID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// zkLogger forwards go-zookeeper's log at debug level, and reads the
// negotiated session timeout from the line it logs after each handshake.
type zkLogger struct{ l *Locker }

func (z zkLogger) Printf(format string, args ...any) {
	if format == "authenticated: id=%d, timeout=%d" && len(args) == 2 {
		if ms, ok := args[1].(int32); ok && ms > 0 {
			z.l.timeout.Store(int64(time.Duration(ms) * time.Millisecond))
			z.l.connOnce.Do(func() { close(z.l.connected) })
		}
	}
	if z.l.log.Enabled(context.Background(), slog.LevelDebug) {
		z.l.log.Debug("zk: " + fmt.Sprintf(format, args...))
	}
}

// lease is one node of ours at the head of its queue.
type lease struct {
	locker   *Locker
	key      string
	path     string
	session  int64 // the session that owns the node
	token    uint64
	ka       *keepalive.Watchdog
	released atomic.Bool
	// watchTimer sets the watch on our node after watchDelay.
	watchTimer *time.Timer
}

func (s *lease) Key() string           { return s.key }
func (s *lease) Token() uint64         { return s.token }
func (s *lease) Lost() <-chan struct{} { return s.ka.Lost() }

// trusted is how long a confirmed check vouches for the session: two
// thirds of its timeout, so the keepalive checks every 2/9 of it. The
// leader's expiry clock does not start at our check: a follower reports
// its clients' activity to the leader in batches, on its pings (every half
// tick), and a follower cut off right after our check never reports it.
// The leader then counts from the last activity it heard of, which is no
// older than the check before (it was reported: the sync of the later
// check went through the leader), 2/9 of the timeout before ours. So the
// leader expires the session no sooner than 7/9 of the timeout after our
// last check, and Lost, at 6/9, closes first (with a full timeout it
// closed up to a ping interval after the rival's grant).
func trusted(timeout time.Duration) time.Duration { return timeout * 2 / 3 }

// check is the keepalive's renewal: our node still exists and is still our
// session's, as the leader has it. Any answer also proves the session alive
// at send time.
func (s *lease) check(ctx context.Context) error {
	l := s.locker
	st, err := call(ctx, l, func() (*zk.Stat, error) {
		// Through the leader: a partitioned follower still serves reads.
		if _, err := l.conn.Sync(s.path); err != nil {
			return nil, err
		}
		ok, st, err := l.conn.Exists(s.path)
		if err == nil && !ok {
			return nil, locking.ErrNotHeld
		}
		return st, err
	})
	if err == nil && st.EphemeralOwner != s.session {
		err = locking.ErrNotHeld
	}
	return err
}

// Release deletes our node. The name is unique to this lease, so a delete
// (and its retry) can only ever remove our own claim.
func (s *lease) Release(ctx context.Context) error {
	notHeld := fmt.Errorf("release %q: %w", s.key, locking.ErrNotHeld)
	if !s.released.CompareAndSwap(false, true) {
		return notHeld
	}
	l := s.locker
	l.mu.Lock()
	closed := l.closed
	delete(l.leases, s.path) // before the delete, so its event is not a loss
	l.mu.Unlock()
	if closed {
		return notHeld // Close ended the session and deleted the node
	}
	// A lease lost before Release began is not held, whatever the
	// deletes below find: when one is retried, a node found gone may be
	// the expiry's doing as well as ours.
	var lostBefore bool
	select {
	case <-s.ka.Lost():
		lostBefore = true
	default:
	}
	s.ka.Stop()
	s.watchTimer.Stop()
	retried := false
	for try := 0; ; try++ {
		if l.conn.SessionID() != s.session {
			if retried && !lostBefore {
				return nil // whether our delete or the expiry took it, it is gone
			}
			s.ka.MarkLost()
			return notHeld
		}
		_, err := call(ctx, l, func() (struct{}, error) { return struct{}{}, l.conn.Delete(s.path, -1) })
		switch {
		case err == nil:
			return nil
		case errors.Is(err, zk.ErrNoNode):
			if retried && !lostBefore {
				return nil // our first delete landed; its reply was lost
			}
			s.ka.MarkLost()
			return notHeld
		case ctx.Err() != nil, try == tries-1, errors.Is(err, errClosed):
			// Stop waiting, not deleting: a node left behind would hold the
			// key for as long as the session lives.
			l.bg.Go(func() { l.remove(s.path, s.session) })
			return s.releaseFailed(err)
		}
		retried = true
		if !l.bg.Sleep(ctx, background.Backoff(try)) {
			l.bg.Go(func() { l.remove(s.path, s.session) })
			return s.releaseFailed(err)
		}
	}
}

// releaseFailed is the error of a Release that could not reach ZooKeeper:
// the lease is not held if it was lost already, else its fate is unknown.
func (s *lease) releaseFailed(err error) error {
	select {
	case <-s.ka.Lost():
		return fmt.Errorf("release %q: %w: %w", s.key, locking.ErrNotHeld, err)
	default:
		return fmt.Errorf("release %q: %w: %w", s.key, locking.ErrUnavailable, err)
	}
}
