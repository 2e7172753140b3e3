package mysqllock

import "github.com/oversold-lab/oversold/locking"

// QueueName exposes the key's named lock to the tests.
var QueueName = queueName

// Queued tells whether a lease's holder took the key's named lock (its
// owner's prefix): a grant without it barged past the queue.
func Queued(l locking.Lease) bool { return l.(*lease).owner[0] == queuedOwner }
