package waitq

// Waiter is one Acquire's interest in the wake-ups of its key, on every
// server it asks (one for redis, each node for redlock).
type Waiter struct {
	notifiers []*Notifier
	channel   string
	member    string
	// Wake is signalled by wake-ups from any server, one signal per
	// server: its buffer has room for one from each.
	Wake    chan struct{}
	watches []*Watch
}

// NewWaiter returns the waiter member of channel. If every server has the
// channel subscribed already (the key is hot), it joins those subscriptions
// at once, before its first try, which then cannot miss a release.
func NewWaiter(notifiers []*Notifier, channel, member string) *Waiter {
	w := &Waiter{notifiers: notifiers, channel: channel, member: member, Wake: make(chan struct{}, len(notifiers))}
	for _, n := range notifiers {
		watch := n.JoinAs(channel, member, w.Wake)
		if watch == nil {
			w.Stop()
			w.watches = nil
			break
		}
		w.watches = append(w.watches, watch)
	}
	return w
}

// Subscribed reports whether the waiter listens on every server.
func (w *Waiter) Subscribed() bool { return w.watches != nil }

// Subscribe subscribes on every server and returns the channels that close
// once each server has confirmed it: a try made after that sees every
// release it is not told of.
func (w *Waiter) Subscribe() []<-chan struct{} {
	var ready []<-chan struct{}
	for _, n := range w.notifiers {
		watch := n.WatchAs(w.channel, w.member, w.Wake)
		w.watches = append(w.watches, watch)
		ready = append(ready, watch.Ready())
	}
	return ready
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
		watch.Stop()
	}
}
