package waitq

// Waiter is one Acquire's interest in the wake-ups of its key, on every
// server it asks (one for redis, each node for redlock).
type Waiter struct {
	notifiers []*Notifier
	channel   string
	member    string
	// Wake is signalled by wake-ups from any server, one signal per
	// server: its buffer has room for one from each.
	Wake chan struct{}
	// Grant holds the latest lock handed to this waiter by a release
	// (release.lua's 'g'): the token, in decimal, ahead of its wake-up.
	Grant   chan string
	watches []*Watch // per server; nil where not watched yet
}

// NewWaiter returns the waiter member of channel. Where a server has the
// channel subscribed already (the key is hot), it joins that subscription
// at once, before its first try, which then cannot miss a release there.
func NewWaiter(notifiers []*Notifier, channel, member string) *Waiter {
	w := &Waiter{notifiers: notifiers, channel: channel, member: member, Wake: make(chan struct{}, len(notifiers)), Grant: make(chan string, 1), watches: make([]*Watch, len(notifiers))}
	for i, n := range notifiers {
		w.watches[i] = n.JoinAs(channel, member, w.Wake, w.Grant)
	}
	return w
}

// Listening counts the servers whose subscription the waiter joined.
func (w *Waiter) Listening() int {
	n := 0
	for _, watch := range w.watches {
		if watch != nil {
			n++
		}
	}
	return n
}

// Subscribe subscribes on every server not joined yet and returns, per
// server, a channel that closes once the server has confirmed the
// subscription: a try made after that sees every release there it is not
// told of.
func (w *Waiter) Subscribe() []<-chan struct{} {
	ready := make([]<-chan struct{}, len(w.notifiers))
	for i, n := range w.notifiers {
		if w.watches[i] == nil {
			w.watches[i] = n.WatchAs(w.channel, w.member, w.Wake, w.Grant)
		}
		ready[i] = w.watches[i].Ready()
	}
	return ready
}

// Moved tells whether a node stopped serving the channel's Cluster slot
// during the wait (Watch.Moved): the waiter must watch on the node that
// serves it now, addr if the server named it.
func (w *Waiter) Moved() (moved bool, addr string) {
	for _, watch := range w.watches {
		if watch != nil {
			if moved, addr = watch.Moved(); moved {
				return moved, addr
			}
		}
	}
	return false, ""
}

// Drain drops the pending wake-ups: the next try sees every release told so
// far, and a grant uses it up (Stop would pass it on to another watcher).
func (w *Waiter) Drain() {
	for {
		select {
		case <-w.Wake:
		default:
			return
		}
	}
}

// Stop ends the watches; a wake-up not drained passes to another watcher.
func (w *Waiter) Stop() {
	for _, watch := range w.watches {
		if watch != nil {
			watch.Stop()
		}
	}
}
