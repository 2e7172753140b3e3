// Package locking is the contract every distributed lock in oversold keeps.
//
// A Locker hands out Leases on string keys. A Lease is a time-limited claim:
// every lease-based lock can have two holders at once (a paused process, a
// slow network, a failover), so a Lease carries a fencing token that storage
// can check, and a Lost channel that tells the holder to stop trusting it.
// The backends live in sub-packages and open by name through
// locking/backends; locking/locktest is the one suite they all pass.
package locking

import (
	"context"
	"errors"
)

var (
	// ErrNotHeld is returned by Release (and by renewals) when the lease is no
	// longer held by its owner: released already, expired, or taken over.
	ErrNotHeld = errors.New("locking: lease not held")
	// ErrUnavailable wraps failures to reach the lock service.
	ErrUnavailable = errors.New("locking: backend unavailable")
)

// Locker grants exclusive leases on keys. Implementations must be safe for
// concurrent use by many goroutines.
type Locker interface {
	// Acquire blocks until the lock on key is held, ctx is done, or the
	// backend fails. When ctx ends the wait, the error wraps ctx.Err(), so
	// errors.Is(err, context.DeadlineExceeded) holds for a deadline, and
	// nothing the wait created is left on the server. A backend failure
	// wraps ErrUnavailable.
	Acquire(ctx context.Context, key string) (Lease, error)
	// Close releases the Locker's resources (connections, sessions). Leases
	// still held may be lost; their Lost channels close.
	Close() error
}

// Lease is one holder's claim on a key. Its methods are safe for concurrent use.
type Lease interface {
	// Key is the key the lease was granted on.
	Key() string
	// Token is a fencing token: strictly greater for every later grant of
	// the same key, so storage can refuse a write from an older holder.
	// Zero means the backend has no safe token.
	Token() uint64
	// Lost is closed once the lease can no longer be trusted: the server
	// dropped it, a renewal failed past the lease's validity, or the session
	// ended. A backend closes it before the server could grant the key to
	// someone else wherever its clock model allows. It is not closed by
	// Release.
	Lost() <-chan struct{}
	// Release gives the lock up. It only ever removes this lease's own claim:
	// if the lease was lost, or released already, it returns ErrNotHeld and
	// leaves a newer holder untouched. Release stops any renewal before it
	// returns. Callers pass a fresh bounded context, not a cancelled one.
	Release(ctx context.Context) error
}

// Identifier is implemented by a Locker whose tokens count in the data of
// one set of servers: an etcd cluster's revisions, a ZooKeeper ensemble's
// zxids, a Redis's counters. Identity names that data: Lockers on the same
// servers get the same identity, before and after those restart with their
// data, and servers whose data started afresh (a new cluster or ensemble,
// a Redis that lost its data) give another one, since their tokens may
// start again below the ones already handed out. The identity lives in
// the servers' own data (a random value the first call that finds none
// writes), so it goes wherever the data goes. Storage raises its fence
// epoch when the identity changes (docs/design.md, "Guards").
type Identifier interface {
	Identity(ctx context.Context) (string, error)
}

// IdentityOf returns l's Identity, or "" when l is nil or has none (its
// tokens are counted in one place for its backend's name, like the mysql
// lock's, whose epoch lives in the database the fences live in; or they
// are no safe tokens at all).
func IdentityOf(ctx context.Context, l Locker) (string, error) {
	if id, ok := l.(Identifier); ok {
		return id.Identity(ctx)
	}
	return "", nil
}
