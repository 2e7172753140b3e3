// Package order is oversold's order flow and its HTTP API (echo).
//
// Service.Place runs the flow of docs/design.md, one step per line of placeOnce:
//
//  1. replay: an order with the same Idempotency-Key exists: return it
//  2. lease := Locker.Acquire(ctx, "sku/"+sku)        (no Locker: lock=none)
//  3. stock := the cache's entry (a miss reads MySQL and fills it)
//  4. stock < quantity: out of stock
//  5. the work delay: business logic inside the critical section
//  6. one MySQL transaction: the guarded stock write and the order insert
//  7. the cache takes the new stock and version
//  8. lease.Release, after the commit, with a context of its own
//
// The package declares the small interfaces it needs (store.go's, one per
// part of the package, Cache, Locker); storage, inventory and locking
// satisfy them.
//
// Service.Handler serves the API of docs/design.md. Choices docs/design.md leaves
// open, made here:
//
//   - Admin routes with an empty admin token answer 401 unauthorized, like a
//     wrong token, so a client learns nothing new from the difference.
//   - A SKU or order id in a GET path that could never exist is 404
//     unknown_sku / not_found without a database query; in a PUT path, 400.
//   - A failure nobody anticipated (MySQL or Redis failing mid-request) is
//     503 unavailable with Retry-After, never a 500: retrying with the same
//     Idempotency-Key is safe. Its metrics outcome is "error".
//   - An Idempotency-Key is at most 255 printable ASCII characters, an exact
//     byte string like SKUs and ids (docs/design.md, "Identity"). Replayed
//     with the same body it returns the first order; with another, 422.
//   - Error messages say what the client did wrong and nothing else: no
//     stock figures, addresses or driver messages (those go to the log).
package order

import (
	"context"
	"errors"
	"time"

	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/storage"
)

// Order is an order as the API shows it.
type Order struct {
	ID        string    `json:"id"`
	SKU       string    `json:"sku"`
	Quantity  int64     `json:"quantity"`
	Status    string    `json:"status"`
	Instance  string    `json:"instance"`
	Lock      string    `json:"lock"`
	Token     uint64    `json:"token"`
	CreatedAt time.Time `json:"created_at"`
	// ReservationID names the confirmed reservation that made the order.
	ReservationID string `json:"reservation_id,omitempty"`
	// Reason is a rejected order's error code (accept queue).
	Reason string `json:"reason,omitempty"`
}

func fromStorage(o storage.Order) Order {
	v := Order{
		ID: o.ID, SKU: o.SKU, Quantity: o.Quantity, Status: o.Status,
		Instance: o.Instance, Lock: o.Lock, Token: o.Token, CreatedAt: o.CreatedAt.UTC(),
	}
	if o.ReservationID != nil {
		v.ReservationID = *o.ReservationID
	}
	return v
}

// Request is one order to place. Key is the Idempotency-Key, "" for none.
type Request struct {
	SKU      string
	Quantity int64
	Key      string
	id       string // the order's id, when chosen before the flow (the gate)
	// queued: the order came through the queue, accepted at acceptedAt.
	queued     bool
	acceptedAt time.Time
}

// Cache is the stock cache of steps 3 and 7 (inventory.Cache).
type Cache interface {
	// Get returns the SKU's entry; on a miss it fills it from load.
	Get(ctx context.Context, sku string, load func(context.Context) (inventory.Item, error)) (inventory.Item, error)
	// Set caches item unless the cache holds its version or a newer one.
	Set(ctx context.Context, item inventory.Item) error
	// Settle caches item, known to be MySQL's latest: a newer entry goes.
	Settle(ctx context.Context, item inventory.Item) error
	// Force caches item whatever the cache holds.
	Force(ctx context.Context, item inventory.Item) error
	// Invalidate deletes the SKU's entry.
	Invalidate(ctx context.Context, sku string) error
	Ping(ctx context.Context) error
}

// Locker is the lock of step 2; nil means lock=none.
type Locker = locking.Locker

// Errors of the flow and the API, besides storage's sentinels
// (ErrUnknownSKU, ErrOutOfStock, ErrConflict, ErrNotFound), which the API
// answers as they are.
var (
	// ErrInvalid: the request breaks the API's rules (400 invalid_request).
	ErrInvalid = errors.New("invalid request")
	// ErrUnauthorized: an admin route without the right bearer token.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrLockLost: the lease was lost before the write, or the fencing
	// guard refused the write; nothing was written.
	ErrLockLost = errors.New("lock lost")
	// ErrLockTimeout: the lock was not granted within Config.LockWait.
	ErrLockTimeout = errors.New("lock wait timed out")
	// ErrUnavailable: a dependency (lock service, MySQL, Redis) failed.
	ErrUnavailable = errors.New("unavailable")
	// ErrKeyReused: an Idempotency-Key sent again with another body
	// (422 idempotency_key_reused); nothing was changed.
	ErrKeyReused = errors.New("idempotency key reused with another request")
)

func toItem(inv storage.Inventory) inventory.Item {
	return inventory.Item{SKU: inv.SKU, Stock: inv.Stock, Version: inv.Version}
}
