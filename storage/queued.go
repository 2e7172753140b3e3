package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// StatusRejected is the status of a queued order that MySQL did not take:
// out of stock once written, or its key naming another request.
const StatusRejected = "rejected"

// QueuedOrder is the outcome of an order accepted through the queue
// (docs/design.md "Accepting an order (OVERSOLD_ACCEPT)"): confirmed,
// inserted in the transaction of its order row, or rejected with the
// reason's error code. Its primary key is what makes an order's outcome
// one: a redelivered entry, or two consumers of one entry, confirm or
// reject it once, never both.
type QueuedOrder struct {
	ID             string    `gorm:"type:varbinary(36);primaryKey"`
	SKU            string    `gorm:"column:sku;type:varbinary(64);not null"`
	Quantity       int64     `gorm:"not null"`
	Status         string    `gorm:"type:varchar(16);not null"`
	Reason         string    `gorm:"type:varchar(32);not null;default:''"`
	Instance       string    `gorm:"type:varchar(255);not null"` // the replica that settled it
	Lock           string    `gorm:"type:varchar(16);not null"`
	IdempotencyKey *string   `gorm:"type:varbinary(255)"`
	CreatedAt      time.Time `gorm:"type:datetime(6);not null"` // accepted
	SettledAt      time.Time `gorm:"type:datetime(6);not null"`
}

// TableName fixes the table's name.
func (QueuedOrder) TableName() string { return "queued_orders" }

// queuedRows are the confirmed outcomes of a queued write's orders.
func queuedRows(orders []Order) []QueuedOrder {
	now := time.Now().UTC().Truncate(time.Microsecond)
	rows := make([]QueuedOrder, len(orders))
	for i, o := range orders {
		rows[i] = QueuedOrder{ID: o.ID, SKU: o.SKU, Quantity: o.Quantity, Status: StatusConfirmed,
			Instance: o.Instance, Lock: o.Lock, IdempotencyKey: o.IdempotencyKey, CreatedAt: o.CreatedAt, SettledAt: now}
	}
	return rows
}

// QueuedOrders returns the outcomes MySQL holds for the ids, by id.
func (s *Store) QueuedOrders(ctx context.Context, ids []string) (map[string]QueuedOrder, error) {
	var rows []QueuedOrder
	if err := s.db.WithContext(ctx).Where("id IN ?", ids).Find(&rows).Error; err != nil {
		return nil, err
	}
	m := make(map[string]QueuedOrder, len(rows))
	for _, r := range rows {
		m[r.ID] = r
	}
	return m, nil
}

// QueuedOrder returns the outcome of the queued order id: ErrNotFound
// while it has none.
func (s *Store) QueuedOrder(ctx context.Context, id string) (QueuedOrder, error) {
	var o QueuedOrder
	err := s.db.WithContext(ctx).Take(&o, "id = ?", id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return QueuedOrder{}, ErrNotFound
	}
	return o, err
}

// RejectQueued records o as rejected, and claims its key for it unless
// another request holds the key. An order that has an outcome already (a
// redelivery, or another consumer of the entry) keeps it: the outcome that
// holds is returned.
func (s *Store) RejectQueued(ctx context.Context, o QueuedOrder) (QueuedOrder, error) {
	o.Status = StatusRejected
	o.SettledAt = time.Now().UTC().Truncate(time.Microsecond)
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&o).Error; err != nil {
			return err
		}
		if o.IdempotencyKey == nil {
			return nil
		}
		return tx.Exec("INSERT IGNORE INTO idempotency_keys (idempotency_key, kind, ref, created_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6))",
			*o.IdempotencyKey, KindOrder, o.ID).Error
	})
	if mysqlErrno(err) == errDupEntry {
		return s.QueuedOrder(ctx, o.ID)
	}
	if err != nil {
		return QueuedOrder{}, fmt.Errorf("reject queued order %s: %w", o.ID, err)
	}
	return o, nil
}

// KeyRef returns what an idempotency key was used for (its kind and the
// id of what it made): ErrNotFound for a new key.
func (s *Store) KeyRef(ctx context.Context, key string) (IdempotencyKey, error) {
	var k IdempotencyKey
	err := s.db.WithContext(ctx).Take(&k, "idempotency_key = ?", key).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return IdempotencyKey{}, ErrNotFound
	}
	return k, err
}

// IdempotencyKeys returns every idempotency key MySQL holds, orders' and
// holds' alike, if there are at most limit; ok is false when there are
// more.
func (s *Store) IdempotencyKeys(ctx context.Context, limit int) (keys []string, ok bool, err error) {
	err = s.db.WithContext(ctx).Model(&IdempotencyKey{}).Limit(limit+1).Pluck("idempotency_key", &keys).Error
	if err != nil || len(keys) > limit {
		return nil, false, err
	}
	return keys, true, nil
}
