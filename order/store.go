package order

import (
	"context"
	"time"

	"github.com/oversold-lab/oversold/storage"
)

// The MySQL side, one interface per part of the package, each what that
// part calls: a reader sees what the flow needs without the rest.
// storage.Store satisfies them all (Store).

// StockReader reads a SKU's row: steps 3 and 4, and a reservation's reads.
type StockReader interface {
	Inventory(ctx context.Context, sku string) (storage.Inventory, error)
	// InventoryLatest is a lease holder's read: the latest commit.
	InventoryLatest(ctx context.Context, sku string) (storage.Inventory, error)
}

// FlowStore is what the order flow needs (service.go, gate.go, http.go,
// restock.go).
type FlowStore interface {
	StockReader
	// PlaceOrder is step 6: see storage.Store.PlaceOrder.
	PlaceOrder(ctx context.Context, w storage.Write, beforeCommit func() error) (storage.Inventory, error)
	PutInventory(ctx context.Context, p storage.Put) (storage.Inventory, error)
	Order(ctx context.Context, id string) (storage.Order, error)
	// OrderByKey and ReservationByKey answer step 1: a key names one
	// request, an order or a hold.
	OrderByKey(ctx context.Context, key string) (storage.Order, error)
	ReservationByKey(ctx context.Context, key string) (storage.Reservation, error)
	// IdempotencyKeys loads the gate's key set (gate.go).
	IdempotencyKeys(ctx context.Context, limit int) ([]string, bool, error)
}

// ReservationStore is what reservations need (reservations.go, and the
// gate's give-back of a settled hold): see storage.Store.Hold and Settle.
type ReservationStore interface {
	StockReader
	Hold(ctx context.Context, guard storage.Guard, r storage.Reservation, ttl time.Duration, moves []storage.Move) (storage.Reservation, []storage.Inventory, error)
	Settle(ctx context.Context, guard storage.Guard, st storage.Settlement, moves []storage.Move) (storage.Reservation, []storage.Inventory, error)
	Reservation(ctx context.Context, id string) (storage.Reservation, error)
	ReservationByKey(ctx context.Context, key string) (storage.Reservation, error)
	ReservationOrders(ctx context.Context, id string) ([]string, error)
	OrderByKey(ctx context.Context, key string) (storage.Order, error)
}

// SweepStore is what the sweeper needs to find due holds (sweeper.go).
type SweepStore interface {
	DueReservations(ctx context.Context, after storage.Reservation, limit int) ([]storage.Reservation, error)
	SweepState(ctx context.Context) (storage.SweepState, error)
}

// QueueStore is what the accept queue needs: its orders' outcomes
// (queue.go).
type QueueStore interface {
	KeyRef(ctx context.Context, key string) (storage.IdempotencyKey, error)
	Order(ctx context.Context, id string) (storage.Order, error)
	QueuedOrders(ctx context.Context, ids []string) (map[string]storage.QueuedOrder, error)
	QueuedOrder(ctx context.Context, id string) (storage.QueuedOrder, error)
	RejectQueued(ctx context.Context, o storage.QueuedOrder) (storage.QueuedOrder, error)
}

// ReadinessStore is what /readyz and the fences need: the replicas table
// and the fence epochs (ready.go); see storage.Store.AdoptFences.
type ReadinessStore interface {
	Ping(ctx context.Context) error
	Heartbeat(ctx context.Context, r storage.Replica) error
	RemoveReplica(ctx context.Context, instance string) error
	LiveReplicas(ctx context.Context, within time.Duration) ([]storage.Replica, error)
	AdoptFences(ctx context.Context, f storage.Fleet) (epoch uint64, reset bool, err error)
	ReclaimFences(ctx context.Context, f storage.Fleet, held uint64) (epoch uint64, superseded bool, err error)
	Fences(ctx context.Context) (f storage.Fleet, epoch uint64, err error)
}

// Store is all of them: what New takes and splits (storage.Store).
type Store interface {
	FlowStore
	ReservationStore
	SweepStore
	QueueStore
	ReadinessStore
}

var _ Store = (*storage.Store)(nil)
