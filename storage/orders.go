package storage

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Fingerprint is the digest of what a request sent under an idempotency key
// asked for: its kind, then each field, one per line (no field holds a
// newline). A key replayed with another fingerprint is a reused key.
func Fingerprint(kind string, fields ...string) []byte {
	h := sha256.New()
	h.Write([]byte(kind))
	for _, f := range fields {
		h.Write([]byte{'\n'})
		h.Write([]byte(f))
	}
	return h.Sum(nil)
}

// OrderFingerprint is an order request's Fingerprint. Open computes the
// same digest in SQL for orders placed before fingerprints were kept.
func OrderFingerprint(sku string, quantity int64) []byte {
	return Fingerprint("order", sku, strconv.FormatInt(quantity, 10))
}

// Write is the guarded stock write of one or more orders of one SKU (a
// batch, coalesced under one lease): the orders to insert, and what the
// caller read and holds, which the guard checks once for all of them.
type Write struct {
	Guard Guard
	// Orders are the rows to insert, all of one SKU; the sum of their
	// quantities is the decrement.
	Orders []Order
	// Stock and Version are the inventory as the caller read it (step 3),
	// a pair read together (as the cache holds them). The new stock is
	// Stock - the orders' quantity for every guard but atomic.
	Stock   int64
	Version uint64
	// Token is the lease's fencing token (fencing guard, which also
	// requires Version: a valid token on a stale read, as a cache that
	// lost writes in a failover gives, must not write), and Epoch the
	// fence epoch of its backend (AdoptFences): the guard compares the
	// pair (Epoch, Token) with the row's (see fenceBelow).
	Epoch uint64
	Token uint64
	// Decrement makes guard none write stock - quantity rather than the
	// stock read: with the stock gate, the check happened in Redis and
	// MySQL is decremented without a condition, as the flash-sale systems
	// that trust their gate do.
	Decrement bool
	// Queued: the orders came through the queue; each one's confirmed
	// outcome (QueuedOrder) is inserted with it, and an order that has an
	// outcome already is ErrDuplicate.
	Queued bool
}

// sku is the SKU of the write's orders.
func (w Write) sku() string { return w.Orders[0].SKU }

// quantity is the write's decrement: the orders' quantities added up.
func (w Write) quantity() int64 {
	var q int64
	for _, o := range w.Orders {
		q += o.Quantity
	}
	return q
}

// PlaceOrder runs step 6 of the flow in one transaction: the INSERT of the
// orders (one statement), the guarded UPDATE of the inventory row and a check that it changed
// the row (the UPDATE first under the version guard). beforeCommit, if not
// nil, has the last word: an error from it rolls everything back and is
// returned (the flow uses it to refuse writing once its lease is lost).
//
// It returns the SKU's stock and version after the write, for the cache
// (SKU, Stock and Version; Fence too under the fencing guard), without
// reading the row back inside the transaction: the UPDATE's own reply
// carries the new version (see guardedUpdate), and the new stock is the one
// written, Stock - Quantity. The atomic guard decrements in place, so its
// new stock is known only when the version read was the one just before
// ours; otherwise the row is read after the commit, outside the row lock,
// and may show a later write still. Version 0 means that read failed: the
// stock is unknown, nothing to cache.
//
// A refused guard returns ErrConflict (version; fencing when the token is
// newer than the fence but the row moved since the read), ErrStaleFence
// (fencing) or ErrOutOfStock (atomic); a missing row ErrUnknownSKU; an idempotency key
// already used, by an order or a reservation, ErrDuplicate. In every error
// case nothing was written.
func (s *Store) PlaceOrder(ctx context.Context, w Write, beforeCommit func() error) (Inventory, error) {
	if len(w.Orders) == 0 {
		return Inventory{}, errors.New("place order: no order")
	}
	g, err := w.Guard.rule()
	if err != nil {
		return Inventory{}, fmt.Errorf("place order on %q: %w", w.sku(), err)
	}
	inv := Inventory{SKU: w.sku()}
	// The UPDATE locks the SKU's row until the commit, and every order of a
	// hot SKU queues on that lock: the less runs after it the better, so the
	// INSERT goes first (a refused guard rolls it back with the rest), for
	// every guard but version (see versionGuard.insertFirst).
	insertFirst := g.insertFirst()
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if insertFirst {
			if err := insertOrder(tx, w); err != nil {
				return err
			}
		}
		version, changed, err := guardedUpdate(ctx, tx, g, w)
		if err != nil {
			return err
		}
		// Every guard bumps version, so a row that matched also changed:
		// zero rows means the guard refused, or there is no such SKU.
		if !changed {
			return refusal(tx, g, w.sku(), w.Epoch, w.Token)
		}
		inv.Version = version
		if g.fenced() {
			inv.Fence, inv.FenceEpoch = w.Token, w.Epoch
		}
		if !insertFirst {
			if err := insertOrder(tx, w); err != nil {
				return err
			}
		}
		if beforeCommit != nil {
			return beforeCommit()
		}
		return nil
	})
	if mysqlErrno(err) == errLockDeadlock {
		err = fmt.Errorf("%w: %w", ErrConflict, err)
	}
	if err != nil {
		return Inventory{}, fmt.Errorf("place order on %q: %w", w.sku(), err)
	}
	switch {
	case !g.inPlace(w) || inv.Version == w.Version+1:
		// Stock and version change together, so the stock read at
		// w.Version was the stock our write started from.
		inv.Stock = w.Stock - w.quantity()
	default:
		// Another write came between our read and ours: read the row,
		// now that the commit has released it.
		if now, err := s.Inventory(ctx, w.sku()); err == nil {
			inv = Inventory{SKU: now.SKU, Stock: now.Stock, Version: now.Version}
		} else {
			inv.Version = 0
		}
	}
	return inv, nil
}

// insertOrder claims the keys of w's orders (claimKeys) and inserts the
// orders in one statement; a key already used, by an order or a
// reservation, is ErrDuplicate (the batch's orders have ids of their own,
// so only a key can be a duplicate).
func insertOrder(tx *gorm.DB, w Write) error {
	var keys, refs []string
	for _, o := range w.Orders {
		if o.IdempotencyKey != nil {
			keys, refs = append(keys, *o.IdempotencyKey), append(refs, o.ID)
		}
	}
	if err := claimKeys(tx, KindOrder, keys, refs); err != nil {
		return err
	}
	err := tx.Create(&w.Orders).Error
	if err == nil && w.Queued {
		err = tx.Create(queuedRows(w.Orders)).Error
	}
	if mysqlErrno(err) == errDupEntry {
		return fmt.Errorf("%w: %w", ErrDuplicate, err)
	}
	return err
}

// guardedUpdate runs the guard's write (rule.update) and returns the row's
// new version, the UPDATE's insert id, and whether the row changed.
func guardedUpdate(ctx context.Context, tx *gorm.DB, g rule, w Write) (version uint64, changed bool, err error) {
	query, args := g.update(w)
	// The transaction's own connection, for the driver's result: gorm's
	// Exec keeps RowsAffected but drops the insert id.
	res, err := tx.Statement.ConnPool.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, false, err
	}
	n, err := res.RowsAffected()
	if err != nil || n == 0 {
		return 0, false, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, false, err
	}
	return uint64(id), true, nil
}

// refusal tells why g's write of sku, under the lease's (epoch, token),
// changed no row: no such SKU, or the guard's own reason (rule.refuse).
func refusal(tx *gorm.DB, g rule, sku string, epoch, token uint64) error {
	// A locking read sees the row as last committed, as the UPDATE did,
	// not the transaction's snapshot (taken earlier by a multi-SKU move).
	var rows []Inventory
	err := tx.Raw("SELECT fence, fence_epoch FROM inventory WHERE sku = ? LOCK IN SHARE MODE", sku).Scan(&rows).Error
	switch {
	case err != nil:
		return err
	case len(rows) == 0:
		return ErrUnknownSKU
	}
	return g.refuse(rows[0], epoch, token)
}

// Order returns the order with id.
func (s *Store) Order(ctx context.Context, id string) (Order, error) {
	return s.takeOrder(ctx, "id = ?", id)
}

// OrderByKey returns the order placed with an idempotency key.
func (s *Store) OrderByKey(ctx context.Context, key string) (Order, error) {
	return s.takeOrder(ctx, "idempotency_key = ?", key)
}

func (s *Store) takeOrder(ctx context.Context, where string, arg string) (Order, error) {
	var o Order
	err := s.db.WithContext(ctx).Take(&o, where, arg).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Order{}, ErrNotFound
	}
	return o, err
}

// InventoryLatest returns the SKU's row as last committed, waiting for a
// write in flight to commit or roll back first: a share-locked read, in
// a statement of its own, taken for its wait and not kept. A lease holder
// reads so when the cache cannot tell it: the previous holder may have
// been frozen (or cut off) between its UPDATE and its COMMIT, its row lock
// held, and a plain read would see the stock from before that write.
func (s *Store) InventoryLatest(ctx context.Context, sku string) (Inventory, error) {
	var inv Inventory
	err := s.db.WithContext(ctx).Raw("SELECT * FROM inventory WHERE sku = ? LOCK IN SHARE MODE", sku).Scan(&inv).Error
	if err == nil && inv.SKU == "" {
		err = ErrUnknownSKU
	}
	return inv, err
}

// Inventory returns the SKU's inventory row.
func (s *Store) Inventory(ctx context.Context, sku string) (Inventory, error) {
	var inv Inventory
	err := s.db.WithContext(ctx).Take(&inv, "sku = ?", sku).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Inventory{}, ErrUnknownSKU
	}
	return inv, err
}

// Put is an admin's stock reset of one SKU (PUT /v1/inventory/{sku}).
type Put struct {
	SKU   string
	Stock int64
	// IfVersion, when not 0, is the version the admin read: the reset is
	// refused with ErrPrecondition if the row has another (or none).
	IfVersion uint64
	// Token is the fencing token of the SKU's lease the reset is made
	// under (0: none), Epoch the fence epoch of its backend. A pair not
	// above the row's fence (see fenceBelow) is a lease a newer holder has
	// written past, or one of a backend the fleet has left: ErrStaleFence.
	// The row's fence becomes the pair, so an older holder's write after
	// the reset is refused.
	Epoch uint64
	Token uint64
}

// fenceEpoch is the epoch a reset writes with its token: none without one.
func (p Put) fenceEpoch() uint64 {
	if p.Token == 0 {
		return 0
	}
	return p.Epoch
}

// PutInventory creates the SKU with p.Stock, or resets its stock, bumping
// the version either way so that every write read before it is refused by
// the version guard, and the cache takes the new entry. Fences only grow.
//
// It runs under READ COMMITTED: under REPEATABLE READ the locking read of
// a missing row takes a gap lock, and two creators of new SKUs in one gap
// (distinct SKUs, whose locks do not serialise them) then wait for each
// other's gap at their INSERTs, a deadlock. READ COMMITTED takes no gap
// lock. A deadlock still reported is ErrConflict: nothing was written.
func (s *Store) PutInventory(ctx context.Context, p Put) (Inventory, error) {
	var inv Inventory
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if p.Token != 0 {
			if err := refuseOlderEpoch(tx, p.Epoch); err != nil {
				return err
			}
		}
		var cur Inventory
		err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Take(&cur, "sku = ?", p.SKU).Error
		switch {
		case errors.Is(err, gorm.ErrRecordNotFound):
			if p.IfVersion != 0 {
				return ErrPrecondition
			}
			// Two creators of one SKU at once: the second one's INSERT
			// waits for the first's row and then updates it, as a reset
			// would, the fence going to the greater pair. MySQL assigns
			// left to right, each assignment seeing the ones before:
			// fence_epoch goes last.
			err = tx.Exec(`INSERT INTO inventory (sku, stock, version, fence, fence_epoch, created_at, updated_at)
				VALUES (?, ?, 1, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
				ON DUPLICATE KEY UPDATE stock = VALUES(stock), version = version + 1,
					fence = IF((fence_epoch, fence) < (VALUES(fence_epoch), VALUES(fence)), VALUES(fence), fence),
					fence_epoch = GREATEST(fence_epoch, VALUES(fence_epoch)), updated_at = VALUES(updated_at)`,
				p.SKU, p.Stock, p.Token, p.fenceEpoch()).Error
		case err != nil:
			return err
		case p.IfVersion != 0 && cur.Version != p.IfVersion:
			return ErrPrecondition
		case p.Token != 0 && !fenceBelow(cur.FenceEpoch, cur.Fence, p.Epoch, p.Token):
			return ErrStaleFence
		default:
			// The row is locked since the read: cur is its fence.
			fence, epoch := cur.Fence, cur.FenceEpoch
			if p.Token != 0 {
				fence, epoch = p.Token, p.Epoch
			}
			err = tx.Exec(`UPDATE inventory SET stock = ?, version = version + 1,
				fence = ?, fence_epoch = ?, updated_at = UTC_TIMESTAMP(6) WHERE sku = ?`,
				p.Stock, fence, epoch, p.SKU).Error
		}
		if err != nil {
			return err
		}
		if err := tx.Take(&inv, "sku = ?", p.SKU).Error; err != nil {
			return err
		}
		// A fenced reset leaves its own fence, unless another creator
		// with a greater one inserted between the read and the INSERT:
		// then it is stale, and rolls back.
		if p.Token != 0 && (inv.FenceEpoch != p.Epoch || inv.Fence != p.Token) {
			return ErrStaleFence
		}
		return nil
	}, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return Inventory{}, fmt.Errorf("put inventory %q: %w", p.SKU, deadlock(err))
	}
	return inv, nil
}

// Audit is what MySQL holds for one SKU, to check the invariants of
// docs/design.md after a run.
type Audit struct {
	Stock    int64 // current stock
	Reserved int64 // held by reservations
	Ordered  int64 // sum of the quantities of its orders
	Orders   int64 // number of its orders
	// DuplicateKeys counts idempotency keys held by more than one order:
	// the UNIQUE index keeps it 0.
	DuplicateKeys int64
}

// Audit returns the SKU's stock and order totals.
func (s *Store) Audit(ctx context.Context, sku string) (Audit, error) {
	inv, err := s.Inventory(ctx, sku)
	if err != nil {
		return Audit{}, err
	}
	a := Audit{Stock: inv.Stock, Reserved: inv.Reserved}
	db := s.db.WithContext(ctx)
	err = db.Raw("SELECT COUNT(*), COALESCE(SUM(quantity), 0) FROM orders WHERE sku = ?", sku).
		Row().Scan(&a.Orders, &a.Ordered)
	if err != nil {
		return Audit{}, err
	}
	err = db.Raw(`SELECT COUNT(*) FROM (SELECT idempotency_key FROM orders
		WHERE sku = ? AND idempotency_key IS NOT NULL GROUP BY idempotency_key HAVING COUNT(*) > 1) d`, sku).
		Row().Scan(&a.DuplicateKeys)
	return a, err
}

// Heartbeat records that replica r runs with its lock, lock servers,
// guard, gate and accept, now (by the database's clock, which every replica shares). The
// first call inserts the row and sets StartedAt.
func (s *Store) Heartbeat(ctx context.Context, r Replica) error {
	return s.db.WithContext(ctx).Exec(heartbeatSQL, r.Instance, r.Lock, r.LockID, r.Guard, r.Gate, r.Accept).Error
}

// lock is a reserved word in MySQL, hence the backquotes.
const heartbeatSQL = "INSERT INTO replicas (instance, `lock`, lock_id, guard, gate, accept, started_at, heartbeat_at) " +
	"VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)) " +
	"ON DUPLICATE KEY UPDATE `lock` = VALUES(`lock`), lock_id = VALUES(lock_id), guard = VALUES(guard), " +
	"gate = VALUES(gate), accept = VALUES(accept), heartbeat_at = VALUES(heartbeat_at)"

// RemoveReplica deletes a stopping replica's row, so that a restart with
// other settings is not held against it.
func (s *Store) RemoveReplica(ctx context.Context, instance string) error {
	return s.db.WithContext(ctx).Delete(&Replica{}, "instance = ?", instance).Error
}

// LiveReplicas returns the replicas whose last heartbeat is at most within
// ago, by the database's clock.
func (s *Store) LiveReplicas(ctx context.Context, within time.Duration) ([]Replica, error) {
	var rs []Replica
	err := s.db.WithContext(ctx).
		Where("heartbeat_at > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND", within.Microseconds()).
		Order("instance").Find(&rs).Error
	return rs, err
}
