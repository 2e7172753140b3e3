package mysqllock

import "github.com/oversold-lab/oversold/locking"

// QueueName exposes the key's named lock to the tests.
var QueueName = queueName

// Queued tells whether a lease's holder took the key's named lock (its
// owner's prefix): a grant without it barged past the queue.
func Queued(l locking.Lease) bool { return l.(*lease).owner[0] == queuedOwner }

// CheckSettings exposes the decision on the server's settings to the tests.
var CheckSettings = checkSettings

// Closed says whether Close has begun.
func Closed(l *Locker) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// BeforeGrab has l call f as each grab begins, before it looks at the
// caller's ctx; first: the first grab of an Acquire (on a queue
// connection). Set it before l's first Acquire.
func BeforeGrab(l *Locker, f func(first bool)) { l.beforeGrab = f }
