// Package namereuse names an etcdlock session's queue keys so that a hot
// key's turns reuse one name, as concurrency.Mutex does (one key per
// session), where a new name per turn left etcd's index a deleted entry per
// turn, which every look at the queue walks until compaction: thousands of
// names between compactions made each turn cost the server more than the
// last. It plugs into etcdlock.Config.Names.
//
// A number goes back to free once its key is known deleted with no request
// of ours on it in flight, and is used again. One whose key may still be
// written or deleted by a request given up on is retired for the session's
// life: that request would land on the next key of the name. A key with no
// acquisition under way is forgotten, so memory follows the keys in use;
// one that retired a number starts its next numbers above it (floors).
package namereuse

import (
	"hash/maphash"
	"sync"

	"github.com/oversold-lab/oversold/locking/etcdlock"
)

var _ etcdlock.Namer = (*Names)(nil)

// floorBuckets is how many floors a session keeps. floors[b] is above every
// number retired on a forgotten queue that hashes to b, and a new queue's
// numbers start there. One floor for the session would move every key's
// next name at each retirement anywhere, so a hot key idle between turns
// would take a new name after each timed-out Acquire on any key; with 256,
// only after one on a key in its bucket.
const floorBuckets = 256

// Names numbers one session's queue keys. Use New: one per session.
type Names struct {
	mu     sync.Mutex
	queues map[string]*queue // while some number is handed out
	floors [floorBuckets]uint64
	seed   maphash.Seed
}

// queue is the numbering of one queue's keys.
type queue struct {
	next    uint64   // never handed out yet from here on
	free    []uint64 // known deleted, nothing in flight
	active  int      // handed out, not yet given back
	retired bool     // some number below next is retired
}

// New returns the Names of a new session (etcdlock.Config.Names).
func New() etcdlock.Namer { return &Names{queues: map[string]*queue{}, seed: maphash.MakeSeed()} }

func (ns *Names) floor(pfx string) *uint64 {
	return &ns.floors[maphash.String(ns.seed, pfx)%floorBuckets]
}

// Take returns the number of a new key in queue pfx: a free one if any.
func (ns *Names) Take(pfx string) uint64 {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	q := ns.queues[pfx]
	if q == nil {
		q = &queue{next: *ns.floor(pfx)}
		ns.queues[pfx] = q
	}
	q.active++
	if k := len(q.free); k > 0 {
		n := q.free[k-1]
		q.free = q.free[:k-1]
		return n
	}
	q.next++
	return q.next - 1
}

// Give takes number n of queue pfx back: free for reuse when reuse is set,
// else retired. A queue with nothing handed out is forgotten, its free
// numbers with it; if it retired one, its floor first rises to its next.
func (ns *Names) Give(pfx string, n uint64, reuse bool) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	q := ns.queues[pfx]
	q.active--
	if reuse {
		q.free = append(q.free, n)
	} else {
		q.retired = true
	}
	if q.active > 0 {
		return
	}
	if q.retired {
		f := ns.floor(pfx)
		*f = max(*f, q.next)
	}
	delete(ns.queues, pfx)
}

// Entries counts the queues whose numbering ns keeps.
func (ns *Names) Entries() int {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return len(ns.queues)
}

// SameFloor reports whether queues a and b share a floor.
func (ns *Names) SameFloor(a, b string) bool { return ns.floor(a) == ns.floor(b) }
