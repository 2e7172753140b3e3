package waitq

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// healthCheck is how long the subscription connection may stay silent
	// before it is pinged; silent for another healthCheck after the ping, it
	// is replaced. go-redis's own PubSub.Channel checks at about this pace.
	healthCheck = 3 * time.Second
	// commandTimeout bounds one SUBSCRIBE or UNSUBSCRIBE write.
	commandTimeout = time.Second
	// closeWait bounds how long Close waits for the connection's
	// goroutines.
	closeWait = 100 * time.Millisecond
	// linger keeps a channel subscribed for a while after its last watcher
	// left: on a hot key the next wait comes soon, and finds the
	// subscription ready instead of paying SUBSCRIBE and UNSUBSCRIBE again.
	linger = 2 * time.Second
)

// Notifier shares one pub/sub connection among all the waiters of a process
// on one Redis server, and fans release messages out to them per channel.
// One connection per Notifier, not per waiter: a PubSub per Acquire costs a
// connection and a SUBSCRIBE round trip for every wait.
//
// A release message wakes one watcher of its channel: the watcher whose id
// is the message (the release script names the first waiter in the queue),
// or else the one that has waited longest (Redisson's LockPubSub does the
// same per JVM): of the waiters in one process only one can win the freed
// lock, so waking them all would only send the losers back to the server.
// Whenever a subscription is (re)established, every watcher is woken instead, because messages may have
// been missed meanwhile. A channel stays subscribed for a while after its
// last watcher left, so a hot key pays for SUBSCRIBE once, not per wait.
//
// The redis and redlock backends use one Notifier per Redis server they
// talk to.
type Notifier struct {
	client  redis.UniversalClient
	sharded bool // SSUBSCRIBE, not SUBSCRIBE (see NewShardNotifier)

	mu     sync.Mutex
	ps     *redis.PubSub // nil until the first Watch; replaced after a failure
	topics map[string]*topic
	closed bool
	quit   chan struct{} // closed by Close
	done   chan struct{} // closed when the receive loop has ended; nil if it never started
	// SUBSCRIBE and UNSUBSCRIBE commands, queued under mu in the order of
	// the state changes they carry, and written in that order by the
	// writer goroutine without mu: a dial or a slow write never blocks the
	// Acquires that need mu.
	outbox []command
	kick   chan struct{} // a buffer of one: the outbox has commands
	wrote  chan struct{} // closed when the writer has ended; nil if it never started
}

// command is one SUBSCRIBE or UNSUBSCRIBE, bound to the connection that was
// current when it was queued.
type command struct {
	do       func(context.Context, ...string) error
	channels []string
}

// topic is the state of one channel. Its SUBSCRIBE and UNSUBSCRIBE commands
// and their confirmations travel in order on the one connection, so counting
// the unconfirmed ones tells when the server's state matches ours.
type topic struct {
	watches    []*Watch      // oldest first
	subscribed bool          // the last command sent was SUBSCRIBE
	inflight   int           // commands sent and not yet confirmed
	ready      chan struct{} // closed once the server confirmed the subscription
	idle       *time.Timer   // set while subscribed with no watchers: unsubscribes after linger
	resync     bool          // on a new connection: wake every watcher once subscribed
}

// Watch is one waiter's interest in a channel.
type Watch struct {
	n       *Notifier
	channel string
	id      string // a message naming id wakes this watcher first
	wake    chan struct{}
	grant   chan string // hears what follows id in the message, if anything; may be nil
	ready   chan struct{}
	moved   bool   // the node no longer serves the channel's slot (n.mu)
	movedTo string // the node that serves it, if the server said (MOVED)
}

// NewNotifier returns a Notifier over client. It connects at the first Watch.
func NewNotifier(client redis.UniversalClient) *Notifier {
	return &Notifier{client: client, topics: make(map[string]*topic), quit: make(chan struct{}), kick: make(chan struct{}, 1)}
}

// NewShardNotifier returns a Notifier over client, one Redis Cluster
// master, with sharded pub/sub (SSUBSCRIBE): it hears the SPUBLISH wake-ups
// of the locks whose slots client serves (Scripts' sharded flag), which
// stay within that master's shard instead of reaching every node.
func NewShardNotifier(client *redis.Client) *Notifier {
	n := NewNotifier(client)
	n.sharded = true
	return n
}

// open returns a new subscription connection (dialed at its first command).
func (n *Notifier) open() *redis.PubSub {
	if n.sharded {
		return n.client.SSubscribe(context.Background())
	}
	return n.client.Subscribe(context.Background())
}

// subscribe and unsubscribe are the current connection's commands; n.mu is
// held.
func (n *Notifier) subscribe() func(context.Context, ...string) error {
	if n.sharded {
		return n.ps.SSubscribe
	}
	return n.ps.Subscribe
}

func (n *Notifier) unsubscribe() func(context.Context, ...string) error {
	if n.sharded {
		return n.ps.SUnsubscribe
	}
	return n.ps.Unsubscribe
}

// Watch subscribes to channel, if this process is not subscribed yet, and
// registers wake to be signalled (without blocking: give it a buffer of one)
// when a message arrives. Ready closes once the server has confirmed the
// subscription: a message published after that is not missed. Several
// Watches may share one wake channel.
func (n *Notifier) Watch(channel string, wake chan struct{}) *Watch {
	return n.WatchAs(channel, "", wake, nil)
}

// WatchAs is Watch for a watcher named id: a message whose payload is id,
// or id, a space and a grant, wakes this watcher rather than the longest
// waiting one, and the grant is put in grant (a buffer of one, which
// keeps the latest; nil: dropped).
func (n *Notifier) WatchAs(channel, id string, wake chan struct{}, grant chan string) *Watch {
	w := &Watch{n: n, channel: channel, id: id, wake: wake, grant: grant}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		w.ready = make(chan struct{})
		close(w.ready)
		return w
	}
	if n.ps == nil {
		n.ps = n.open()
		n.done, n.wrote = make(chan struct{}), make(chan struct{})
		go n.receive()
		go n.write()
	}
	t := n.topics[channel]
	if t == nil {
		t = &topic{}
		n.topics[channel] = t
	}
	if !t.subscribed {
		t.subscribed = true
		t.ready = make(chan struct{})
		n.send(t, n.subscribe(), channel)
	}
	t.add(w)
	return w
}

// Join is Watch for a channel whose subscription the server has confirmed
// already; it sends nothing, and returns nil if there is no such
// subscription. A waiter that joins before its try cannot miss a release
// that comes after the try.
func (n *Notifier) Join(channel string, wake chan struct{}) *Watch {
	return n.JoinAs(channel, "", wake, nil)
}

// Subscribed reports whether channel has a subscription the server has
// confirmed, which Join would join.
func (n *Notifier) Subscribed(channel string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.confirmed(channel) != nil
}

// confirmed returns channel's topic if the server has confirmed its
// subscription, else nil; n.mu is held.
func (n *Notifier) confirmed(channel string) *topic {
	t := n.topics[channel]
	if n.closed || t == nil || !t.subscribed || !isClosed(t.ready) {
		return nil
	}
	return t
}

// JoinAs is Join for a watcher named id (see WatchAs).
func (n *Notifier) JoinAs(channel, id string, wake chan struct{}, grant chan string) *Watch {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.confirmed(channel)
	if t == nil {
		return nil
	}
	w := &Watch{n: n, channel: channel, id: id, wake: wake, grant: grant}
	t.add(w)
	return w
}

func (t *topic) add(w *Watch) {
	if t.idle != nil {
		t.idle.Stop()
		t.idle = nil
	}
	t.watches = append(t.watches, w)
	w.ready = t.ready
}

// Ready is closed once the subscription is confirmed by the server.
func (w *Watch) Ready() <-chan struct{} { return w.ready }

// Moved tells whether the watch ended because its node no longer serves
// the channel's Cluster slot (see Notifier.leave), and the address of the
// node that does, if the server named it.
func (w *Watch) Moved() (moved bool, addr string) {
	w.n.mu.Lock()
	defer w.n.mu.Unlock()
	return w.moved, w.movedTo
}

// Stop ends the watch; the channel is unsubscribed a while (linger) after
// its last watcher left. A wake-up the watcher did not consume passes to
// the next watcher, so a waiter that gives up cannot swallow a release
// another one needs; a watcher that won the lock should drain its wake
// channel first.
func (w *Watch) Stop() {
	n := w.n
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.topics[w.channel]
	if t == nil {
		return
	}
	i := slices.Index(t.watches, w)
	if i < 0 {
		return
	}
	t.watches = slices.Delete(t.watches, i, i+1)
	select {
	case <-w.wake:
		t.wakeOne()
	default:
	}
	if len(t.watches) == 0 && t.subscribed && !n.closed {
		var idle *time.Timer
		idle = time.AfterFunc(linger, func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			if t.idle == idle && !n.closed { // else a watcher came, or Close
				t.idle = nil
				t.subscribed = false
				n.send(t, n.unsubscribe(), w.channel)
			}
		})
		t.idle = idle
	}
}

// send queues one SUBSCRIBE or UNSUBSCRIBE for t; n.mu is held, so the
// order of writes is the order of state changes.
func (n *Notifier) send(t *topic, cmd func(context.Context, ...string) error, channel string) {
	t.inflight++
	n.queue(cmd, channel)
}

// queue adds a command to the outbox; n.mu is held.
func (n *Notifier) queue(cmd func(context.Context, ...string) error, channels ...string) {
	n.outbox = append(n.outbox, command{do: cmd, channels: channels})
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// write sends the queued commands, in order, until Close. A failed write
// breaks the connection, and the receive loop starts over on a new one.
func (n *Notifier) write() {
	defer close(n.wrote)
	for {
		select {
		case <-n.quit:
			return
		case <-n.kick:
		}
		n.mu.Lock()
		batch := n.outbox
		n.outbox = nil
		n.mu.Unlock()
		for _, c := range batch {
			if isClosed(n.quit) {
				return // Close waits for us: one command at most
			}
			ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
			_ = c.do(ctx, c.channels...)
			cancel()
		}
	}
}

// Close ends every watch (their Ready channels close and their watchers are
// woken) and the connection, waiting for the connection's goroutines at
// most closeWait.
func (n *Notifier) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.end()
	ps, done, wrote := n.ps, n.done, n.wrote
	n.mu.Unlock()
	if ps == nil {
		return nil
	}
	// A dial to a server that does not answer (black-holed) holds the
	// connection until go-redis gives up on it, seconds later: Close waits
	// for that only a while, and the goroutines end by themselves then.
	ended := make(chan error, 1)
	go func() {
		err := ps.Close()
		<-done
		<-wrote
		ended <- err
	}()
	select {
	case err := <-ended:
		return err
	case <-time.After(closeWait):
		return nil
	}
}

// end marks the Notifier closed, ending every watch; n.mu is held.
func (n *Notifier) end() {
	n.closed = true
	close(n.quit)
	for _, t := range n.topics {
		if t.idle != nil {
			t.idle.Stop()
		}
		closeOnce(t.ready)
		t.wakeAll()
	}
}

// Closed tells whether the Notifier has ended: closed by Close, or by
// itself because its client was closed (go-redis closes the client of a
// Cluster node that left the slot map). A closed Notifier wakes nobody
// again: its users take another one.
func (n *Notifier) Closed() bool { return isClosed(n.quit) }

// clientClosed ends the Notifier when ps, its current connection, failed
// because the client is closed: no new connection can come from it, and
// restarting would spin until Close.
func (n *Notifier) clientClosed(ps *redis.PubSub) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.ps != ps { // Close, or a restart, closed ps: not the client
		return
	}
	n.end()
	_ = ps.Close()
}

// receive reads the connection until Close, starting over on a new
// connection whenever the current one fails or falls silent.
func (n *Notifier) receive() {
	defer close(n.done)
	pinged, failures := false, 0
	for {
		n.mu.Lock()
		ps, closed := n.ps, n.closed
		n.mu.Unlock()
		if closed {
			return
		}
		msg, err := ps.ReceiveTimeout(context.Background(), healthCheck)
		var nerr net.Error
		switch {
		case err == nil:
			pinged, failures = false, 0
			n.dispatch(msg)
		case errors.As(err, &nerr) && nerr.Timeout() && !pinged:
			pinged = true
			ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
			_ = ps.Ping(ctx)
			cancel()
		case errors.Is(err, redis.ErrClosed):
			n.clientClosed(ps) // the loop ends at the top, closed
		case n.sharded && n.movedReply(err):
			pinged, failures = false, 0 // an answer: the connection is fine
		default:
			// Broken, or silent even after a ping. Back off from
			// the second failure in a row: the server may be down.
			if failures++; failures > 1 {
				d := min(time.Second, 50*time.Millisecond<<min(failures, 5))
				select {
				case <-n.quit:
					return
				case <-time.After(d/2 + rand.N(d/2)):
				}
			}
			pinged = false
			n.restart(ps)
		}
	}
}

// restart replaces the connection old with a new one subscribed to every
// channel still watched. Releases may have been missed while the old
// connection was failing, so once the server confirms the new subscription,
// every watcher is woken to look at the lock again.
func (n *Notifier) restart(old *redis.PubSub) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.ps != old {
		return
	}
	_ = old.Close()
	n.ps = n.open()
	var channels []string
	for ch, t := range n.topics {
		if len(t.watches) == 0 {
			if t.idle != nil {
				t.idle.Stop()
				t.idle = nil
			}
			delete(n.topics, ch)
			continue
		}
		channels = append(channels, ch)
		closeOnce(t.ready) // who waits for the old subscription tries now
		t.subscribed, t.inflight, t.ready, t.resync = true, 1, make(chan struct{}), true
	}
	// One command per channel: the channels of one SSUBSCRIBE must share a
	// Cluster slot (CROSSSLOT otherwise, and the notifier would restart
	// for good); each gets its own confirmation.
	for _, ch := range channels {
		n.queue(n.subscribe(), ch)
	}
}

// movedReply handles err if it is a MOVED reply, to an SSUBSCRIBE or
// SUNSUBSCRIBE of ours: the node does not serve that slot (it migrated, or
// the slot map that chose this node was stale). Every channel of the slot
// leaves the Notifier, whose connection is fine and stays; restarting it
// would be refused again, in a loop, for as long as the channel is
// watched.
func (n *Notifier) movedReply(err error) bool {
	addr, ok := redis.IsMovedError(err)
	if !ok {
		return false
	}
	f := strings.Fields(err.Error()) // MOVED <slot> <host:port>
	if len(f) != 3 {
		return false
	}
	s, perr := strconv.Atoi(f[1])
	if perr != nil {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch, t := range n.topics {
		if slot(ch) == s {
			n.leave(ch, t, addr)
		}
	}
	return true
}

// leave ends channel's topic because the node no longer serves its slot;
// n.mu is held. Its watchers are woken and see Moved, and their Ready
// channels close: they must watch on the node that serves the slot now
// (addr, if the server named it). A later Watch here subscribes afresh.
func (n *Notifier) leave(channel string, t *topic, addr string) {
	if t.idle != nil {
		t.idle.Stop()
		t.idle = nil // a linger timer firing now sends nothing
	}
	delete(n.topics, channel)
	for _, w := range t.watches {
		w.moved, w.movedTo = true, addr
	}
	closeOnce(t.ready)
	t.wakeAll()
}

// awaitsUnsubscribe tells whether the oldest unconfirmed command of t is an
// UNSUBSCRIBE: the commands alternate, the last one sent being SUBSCRIBE
// if and only if t is subscribed.
func (t *topic) awaitsUnsubscribe() bool {
	return t.inflight > 0 && (t.inflight%2 == 1) != t.subscribed
}

func (n *Notifier) dispatch(msg any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch m := msg.(type) {
	case *redis.Message:
		if t := n.topics[m.Channel]; t != nil {
			t.wake(m.Payload)
		}
	case *redis.Subscription:
		t := n.topics[m.Channel]
		if t == nil {
			return
		}
		if n.sharded && m.Kind == "sunsubscribe" && !t.awaitsUnsubscribe() {
			// Not an answer to us: Redis 7 pushes it to every
			// subscriber of a slot the node stops serving (the slot
			// migrated away). The server dropped the subscription.
			n.leave(m.Channel, t, "")
			return
		}
		if t.inflight > 0 {
			t.inflight--
		}
		switch {
		case t.inflight > 0:
		case t.subscribed:
			closeOnce(t.ready)
			if t.resync {
				t.resync = false
				t.wakeAll()
			}
		default:
			delete(n.topics, m.Channel)
		}
	}
}

// wake signals the watcher the payload names ("<id>" or "<id> <grant>"),
// handing it the grant, or else the longest waiting one.
func (t *topic) wake(payload string) {
	id, grant, _ := strings.Cut(payload, " ")
	if id != "" {
		for _, w := range t.watches {
			if w.id == id {
				if grant != "" && w.grant != nil {
					select { // keep the latest
					case <-w.grant:
					default:
					}
					select {
					case w.grant <- grant:
					default:
					}
				}
				signal(w.wake)
				return
			}
		}
	}
	t.wakeOne()
}

// wakeOne signals the longest waiting watcher; if it has a wake-up pending
// already, it has yet to look at the lock, which will show it this release.
func (t *topic) wakeOne() {
	if len(t.watches) > 0 {
		signal(t.watches[0].wake)
	}
}

func (t *topic) wakeAll() {
	for _, w := range t.watches {
		signal(w.wake)
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// closeOnce closes c unless it is closed already; callers hold the lock.
func closeOnce(c chan struct{}) {
	if c != nil && !isClosed(c) {
		close(c)
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
