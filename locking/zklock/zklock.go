// Package zklock is the ZooKeeper lock recipe: ephemeral sequential nodes
// in a queue, each waiter watching only its predecessor (go-zookeeper's
// lock.go, Curator's InterProcessMutex).
//
// Acquire creates an ephemeral sequential node under <Root>/<key escaped>
// and lists the children: the lowest sequence holds the lock, the others
// each watch the node just below their own, so a release wakes one waiter.
// Release deletes the node, checked against the session that made it. A
// wait ended by ctx deletes it in the background, never with the caller's ctx.
//
// The Locker owns its session, whose timeout is the lease's TTL. Lost
// closes when the session expires, our node is deleted, or no ownership
// check has succeeded for 2/3 of the timeout. The token is the parent's
// pzxid in the listing that granted the lock: it only grows.
//
// Config.Create and Config.Watchdog plug in the hardening locking/backends
// composes (locking/zklock/protected and handover, locking/keepalive). Why
// each choice is safe, the failure modes and the peers: docs/locks/zklock.md.
package zklock

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/locking"
)

const (
	// DefaultRoot is the parent of every key's node when Config.Root is "".
	DefaultRoot = "/oversold/locks"
	// DefaultSessionTimeout is the session timeout when Config.SessionTimeout is 0.
	DefaultSessionTimeout = 10 * time.Second
	// Suffix ends the name of every queue node, before the server's sequence.
	Suffix = "lock-"
	// Tries bounds every retry loop that does not end with a ctx.
	Tries = 5
)

// Config tunes a Locker. Zero values mean the documented defaults.
type Config struct {
	// SessionTimeout is the lease's TTL, as the server clamps it. 0 = DefaultSessionTimeout.
	SessionTimeout time.Duration
	// Root is the node under which each key gets its queue. "" = DefaultRoot.
	Root string
	// Dialer opens connections to the servers (a proxy, TLS). nil = net.DialTimeout.
	Dialer zk.Dialer
	// Create makes our queue node. nil = CreateOnce.
	Create CreateFunc
	// Watchdog keeps a granted lease's Lost between events. nil = a timer per lease.
	Watchdog WatchdogFunc
	// ACL is the ACL of every node the Locker makes. nil = zk.WorldACL(zk.PermAll).
	ACL []zk.ACL
}

var (
	// ErrVanished: our queue node is gone (its session expired, or a delete); Acquire queues again.
	ErrVanished = errors.New("zklock: our queue node vanished")
	errClosed   = fmt.Errorf("zklock: locker closed: %w", locking.ErrUnavailable)
	errRetry    = errors.New("zklock: look again")
)

// Locker hands out leases backed by one ZooKeeper session; safe for concurrent use.
type Locker struct {
	cfg  Config
	conn *zk.Conn

	timeout   atomic.Int64  // negotiated session timeout, in ns
	connected chan struct{} // closed once the first session's timeout is known
	connOnce  sync.Once
	drained   chan struct{} // closed when go-zookeeper's goroutines are gone

	mu     sync.Mutex
	leases map[string]*lease // held leases by node path
	closed bool
	done   chan struct{}  // closed by Close
	wg     sync.WaitGroup // cleanups and watches under way
}

// New connects and waits, within ctx, for a session: the Locker owns it, it is the lease.
func New(ctx context.Context, servers []string, cfg Config) (*Locker, error) {
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	cfg.Root = strings.TrimRight(cmp.Or(cfg.Root, DefaultRoot), "/")
	if !strings.HasPrefix(cfg.Root, "/") {
		return nil, fmt.Errorf("zklock: root %q is not an absolute path", cfg.Root)
	}
	if cfg.Create == nil {
		cfg.Create = CreateOnce
	}
	if cfg.Watchdog == nil {
		cfg.Watchdog = startWatchdog
	}
	if cfg.ACL == nil {
		cfg.ACL = zk.WorldACL(zk.PermAll)
	}
	if cfg.Dialer == nil {
		cfg.Dialer = net.DialTimeout
	}
	l := &Locker{cfg: cfg, done: make(chan struct{}), connected: make(chan struct{}),
		drained: make(chan struct{}), leases: make(map[string]*lease)}
	l.timeout.Store(int64(cfg.SessionTimeout))
	conn, events, err := zk.Connect(servers, cfg.SessionTimeout, zk.WithDialer(cfg.Dialer),
		zk.WithEventCallback(l.onEvent), zk.WithLogger(zkLogger{l}), zk.WithLogInfo(true))
	if err != nil {
		return nil, fmt.Errorf("zklock: connect %v: %w", servers, err)
	}
	l.conn = conn
	go func() { // the callback sees the events; this tells the end
		for range events {
		}
		close(l.drained)
	}()
	// go-zookeeper retries unreachable servers forever: bound the wait.
	ctx, cancel := context.WithTimeout(ctx, max(cfg.SessionTimeout, 5*time.Second))
	defer cancel()
	select {
	case <-l.connected:
		return l, nil
	case <-ctx.Done():
		l.Close()
		return nil, fmt.Errorf("zklock: no session with %v: %w", servers, ctx.Err())
	}
}

// SessionTimeout is the session timeout the server granted: the leases' TTL.
func (l *Locker) SessionTimeout() time.Duration { return time.Duration(l.timeout.Load()) }

// Conn, Root and ACL are the Locker's connection, root and ACL, for the plugs.
func (l *Locker) Conn() *zk.Conn { return l.conn }
func (l *Locker) Root() string   { return l.cfg.Root }
func (l *Locker) ACL() []zk.ACL  { return l.cfg.ACL }

// Go runs f on a goroutine Close waits for; false, f not run, after Close.
func (l *Locker) Go(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.wg.Go(f)
	}
	return !l.closed
}

// Sleep waits d; false if ctx ended or the Locker closed meanwhile.
func (l *Locker) Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-l.done:
	}
	return false
}

// Close ends the session (its nodes go, held leases are lost) and waits for the goroutines.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	held := slices.Collect(maps.Values(l.leases))
	clear(l.leases)
	l.mu.Unlock()
	l.conn.Close() // first: a check in flight, which Stop may wait for, fails now
	for _, s := range held {
		s.dog.Stop()
		s.dog.MarkLost()
	}
	<-l.drained
	l.wg.Wait()
	return nil
}

// Acquire queues for key and waits for its turn, ctx, or a failure.
func (l *Locker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	if key == "" {
		return nil, errors.New(`acquire "": empty key`)
	}
	parent := l.cfg.Root + "/" + escape(key)
	var err error
	for range Tries {
		var s *lease
		if s, err = l.queue(ctx, key, parent); err == nil {
			return s, nil
		}
		if !errors.Is(err, ErrVanished) {
			break
		}
	}
	return nil, locking.AcquireError(ctx, key, err)
}

// queue creates our node and waits for our turn; a node left on failure or ctx goes in the background.
func (l *Locker) queue(ctx context.Context, key, parent string) (*lease, error) {
	path, session, err := l.cfg.Create(l, parent)
	if err != nil {
		if !errors.Is(err, locking.ErrUnavailable) && !errors.Is(err, ErrVanished) {
			err = fmt.Errorf("%w: create: %w", locking.ErrUnavailable, err)
		}
		return nil, err
	}
	s, err := l.wait(ctx, key, parent, path, session)
	if err != nil && !errors.Is(err, ErrVanished) {
		l.Remove(path, session)
	}
	return s, err
}

// CreateOnce is the default CreateFunc. A fresh GUID in the name (Curator's
// protection mode) finds the node of a create whose reply was lost. The node
// is the session's only if the session did not change across the create (a
// request goes out on the session of the moment): else ErrVanished.
func CreateOnce(l *Locker, parent string) (path string, session int64, err error) {
	name := "_c_" + rand.Text() + "-" + Suffix
	defer func() {
		if err != nil {
			l.Go(func() { l.removeNamed(parent, name) })
		}
	}()
	for range Tries {
		session = l.conn.SessionID()
		path, err = l.conn.Create(parent+"/"+name, nil, zk.FlagEphemeral|zk.FlagSequence, l.cfg.ACL)
		if errors.Is(err, zk.ErrConnectionClosed) {
			path, err = l.find(parent, name)
		}
		switch {
		case err == nil && path != "" && session != 0 && l.conn.SessionID() == session:
			return path, session, nil
		case err == nil && path != "":
			return "", 0, ErrVanished
		case errors.Is(err, zk.ErrNoNode): // no parent yet, or a container just removed
			err = l.MakePath(parent)
		}
		if err != nil {
			return "", 0, err
		}
	}
	return "", 0, cmp.Or(err, zk.ErrNoNode)
}

// find returns the path of our node (name and the sequence), or "". The
// sync first: the server we reconnected to may lag the create; one sent
// before the reconnection fails unsent (ErrNoServer), so it goes again.
func (l *Locker) find(parent, name string) (string, error) {
	_, err := l.conn.Sync(parent)
	for n := 0; errors.Is(err, zk.ErrNoServer) && n < Tries; n++ {
		_, err = l.conn.Sync(parent)
	}
	if err != nil {
		return "", err
	}
	children, _, err := l.conn.Children(parent)
	for _, c := range children {
		if strings.HasPrefix(c, name) {
			return parent + "/" + c, nil
		}
	}
	return "", err
}

// removeNamed deletes the node a failed create may have made, once a look
// answers. A node not of our session after the look died with its own.
func (l *Locker) removeNamed(parent, name string) {
	for n := 0; ; n++ {
		path, err := l.find(parent, name)
		if path != "" {
			l.Remove(path, l.conn.SessionID())
		}
		if err == nil || errors.Is(err, zk.ErrNoNode) || !l.Sleep(context.Background(), Backoff(n)) {
			return
		}
	}
}

// MakePath creates path and its missing ancestors as container nodes,
// which the server removes once their last child is gone.
func (l *Locker) MakePath(path string) error {
	var err error
	for range Tries {
		_, err = l.conn.CreateContainer(path, nil, zk.FlagContainer, l.cfg.ACL)
		dir := path[:strings.LastIndexByte(path, '/')]
		if !errors.Is(err, zk.ErrNoNode) || dir == "" {
			break
		}
		if err = l.MakePath(dir); err != nil {
			return err
		}
	}
	if errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	return err
}

// wait waits until our node is the lowest in the queue, watching only the
// node below it; failing requests are retried while the session may live.
func (l *Locker) wait(ctx context.Context, key, parent, path string, session int64) (*lease, error) {
	name := path[len(parent)+1:]
	seq, ok := Sequence(name)
	if !ok {
		return nil, fmt.Errorf("zklock: unexpected node name %q", name)
	}
	var failing time.Time // since when requests fail
	for try := 0; ; try++ {
		sent := time.Now()
		pzxid, err := l.look(ctx, parent, name, seq)
		switch {
		case err == nil: // the session answered at sent: the lease is valid from then
			return l.grant(key, path, session, sent, pzxid)
		case errors.Is(err, errRetry):
			failing = time.Time{}
			continue
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, ErrVanished), errors.Is(err, errClosed):
			return nil, err
		case errors.Is(err, zk.ErrNoNode): // the parent is gone, so is our node
			return nil, ErrVanished
		case failing.IsZero():
			failing = time.Now()
		case time.Since(failing) > l.SessionTimeout():
			return nil, fmt.Errorf("%w: %w", locking.ErrUnavailable, err)
		}
		if !l.Sleep(ctx, Backoff(try)) {
			return nil, cmp.Or(ctx.Err(), errClosed)
		}
	}
}

// look lists the queue: nil when ours is first (with the parent's pzxid,
// the token), errRetry once the predecessor went.
func (l *Locker) look(ctx context.Context, parent, name string, seq int64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	children, st, err := l.conn.Children(parent)
	if err != nil {
		return 0, err
	}
	pred, mine := predecessor(children, name, seq)
	if !mine {
		return 0, ErrVanished
	}
	if pred == "" {
		return st.Pzxid, nil // our turn
	}
	_, _, gone, err := l.conn.GetW(parent + "/" + pred)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, errRetry // went while we looked
	}
	if err != nil {
		return 0, err
	}
	select {
	case <-gone:
		return 0, errRetry
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-l.done:
		return 0, errClosed
	}
}

// onEvent hears every go-zookeeper event, on its goroutines: it must not
// block, nor call the connection.
func (l *Locker) onEvent(ev zk.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ev.Type == zk.EventSession && ev.State == zk.StateExpired {
		for _, s := range l.leases { // go-zookeeper opens a new session
			s.dog.MarkLost()
		}
	} else if s := l.leases[ev.Path]; s != nil && (ev.Type == zk.EventNodeDeleted || ev.Type == zk.EventNotWatching) {
		s.dog.MarkLost() // our node deleted, or its watch dropped
	}
}

// Remove deletes a node of ours in the background, until it is gone, its
// session is (an ephemeral node ends with it), or the Locker closes.
func (l *Locker) Remove(path string, session int64) {
	l.Go(func() {
		for n := 0; l.conn.SessionID() == session; n++ {
			err := l.conn.Delete(path, -1)
			if err == nil || errors.Is(err, zk.ErrNoNode) || !l.Sleep(context.Background(), Backoff(n)) {
				return
			}
		}
	})
}

// predecessor returns the node just below ours ("" if none) and whether ours is listed.
func predecessor(children []string, name string, seq int64) (pred string, mine bool) {
	best := int64(-1)
	for _, c := range children {
		if c == name {
			mine = true
			continue
		}
		if n, ok := Sequence(c); ok && n < seq && n > best {
			pred, best = c, n
		}
	}
	return pred, mine
}

// Sequence parses the server's sequence suffix of a queue node's name.
func Sequence(name string) (int64, bool) {
	i := strings.LastIndex(name, Suffix)
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(name[i+len(Suffix):], 10, 64)
	return n, err == nil
}

// escape makes key one path segment: '/' and anything ZooKeeper refuses in
// a path become %XX, and so do dots ("." and ".." are not node names).
func escape(key string) string {
	return strings.ReplaceAll(url.PathEscape(key), ".", "%2E")
}

// zkLogger reads the negotiated session timeout from the line go-zookeeper
// logs after each handshake (it has no getter for it); the rest is dropped.
type zkLogger struct{ l *Locker }

func (z zkLogger) Printf(format string, args ...any) {
	if format == "authenticated: id=%d, timeout=%d" && len(args) == 2 {
		if ms, ok := args[1].(int32); ok && ms > 0 {
			z.l.timeout.Store(int64(time.Duration(ms) * time.Millisecond))
			z.l.connOnce.Do(func() { close(z.l.connected) })
		}
	}
}
