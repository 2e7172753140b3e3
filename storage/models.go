package storage

import "time"

// Inventory is one SKU's stock. Version grows with every write, whatever
// the guard, so the cache can tell a newer entry from an older one.
// (FenceEpoch, Fence) is the highest fence that wrote the row (fencing
// guard only; see fenceBelow): the epoch the writer adopted, and its
// lease's token. Stock is what can be sold or held now; Reserved is what
// reservations hold (docs/design.md, "Reservations"): stock set = Stock +
// Reserved + sold.
type Inventory struct {
	SKU        string    `gorm:"column:sku;type:varbinary(64);primaryKey"`
	Stock      int64     `gorm:"not null"`
	Reserved   int64     `gorm:"not null;default:0"`
	Version    uint64    `gorm:"not null"`
	Fence      uint64    `gorm:"not null"`
	FenceEpoch uint64    `gorm:"not null;default:0"`
	CreatedAt  time.Time `gorm:"type:datetime(6);not null"`
	UpdatedAt  time.Time `gorm:"type:datetime(6);not null"`
}

// TableName fixes the table's name: the lab and outside tools read it.
func (Inventory) TableName() string { return "inventory" }

// StatusConfirmed is the status of every order the flow writes: an order
// exists only once its stock write committed with it.
const StatusConfirmed = "confirmed"

// Order is one placed order. IdempotencyKey is NULL when the client sent
// none; the UNIQUE index on it is what makes two concurrent requests with
// one key create one order. Fingerprint is what the request under that key
// asked for (see OrderFingerprint): a key reused with another body is
// refused by comparing it.
//
// The SKU, the key and the id are VARBINARY: exact byte strings, as in the
// cache and the lock keys (docs/design.md, "Identity"). A case-insensitive
// or PAD SPACE collation would take "SKU-1" and "sku-1", or "k" and "k ",
// for one row while the locks take them for two.
type Order struct {
	ID             string    `gorm:"type:varbinary(36);primaryKey"` // UUIDv7: ordered by time
	SKU            string    `gorm:"column:sku;type:varbinary(64);not null;index"`
	Quantity       int64     `gorm:"not null"`
	Status         string    `gorm:"type:varchar(16);not null"`
	Instance       string    `gorm:"type:varchar(255);not null"` // the replica that placed it
	Lock           string    `gorm:"type:varchar(16);not null"`  // the lock backend it ran under
	Token          uint64    `gorm:"not null"`                   // the lease's fencing token; 0 = none
	IdempotencyKey *string   `gorm:"type:varbinary(255);uniqueIndex"`
	Fingerprint    []byte    `gorm:"type:varbinary(32)"`       // set with IdempotencyKey
	ReservationID  *string   `gorm:"type:varbinary(36);index"` // the confirmed reservation that made it
	CreatedAt      time.Time `gorm:"type:datetime(6);not null"`
}

// TableName fixes the table's name: the lab and outside tools read it.
func (Order) TableName() string { return "orders" }

// Kinds of request an idempotency key can name.
const (
	KindOrder       = "order"
	KindReservation = "reservation"
)

// IdempotencyKey is a key some request was made under, an order or a hold
// (Kind), with the id of what it made (Ref). Its primary key is what makes
// a key name one request across orders and reservations: the row is
// inserted in the transaction of the order or of the hold, so a second
// request under the key, of either kind, fails its INSERT (after waiting
// for the first one's commit) and writes nothing. The orders' and
// reservations' own UNIQUE indexes stay, for their lookups by key.
type IdempotencyKey struct {
	Key       string    `gorm:"column:idempotency_key;type:varbinary(255);primaryKey"`
	Kind      string    `gorm:"type:varchar(16);not null"`
	Ref       string    `gorm:"type:varbinary(36);not null"`
	CreatedAt time.Time `gorm:"type:datetime(6);not null"`
}

// TableName fixes the table's name.
func (IdempotencyKey) TableName() string { return "idempotency_keys" }

// Meta holds facts about the database itself, one row each: the identity
// written at its first migration (DatabaseIdentity) is the only one so far.
type Meta struct {
	Name  string `gorm:"type:varbinary(64);primaryKey"`
	Value string `gorm:"type:varbinary(255);not null"`
}

// TableName fixes the table's name.
func (Meta) TableName() string { return "meta" }

// Replica is one running orderd, as it announced itself. Replicas behind
// one balancer must agree on lock, lock servers, guard, gate and accept;
// this table lets each check. LockID is the lock servers' identity
// (locking.Identifier): "" for a lock without one, or a row of a version
// that did not record it. Gate and Accept are "" in a row of a version
// that did not record them.
type Replica struct {
	Instance    string    `gorm:"type:varchar(255);primaryKey"`
	Lock        string    `gorm:"type:varchar(16);not null"`
	LockID      string    `gorm:"type:varchar(64);not null;default:''"`
	Guard       string    `gorm:"type:varchar(16);not null"`
	Gate        string    `gorm:"type:varchar(16);not null;default:''"`
	Accept      string    `gorm:"type:varchar(16);not null;default:''"`
	StartedAt   time.Time `gorm:"type:datetime(6);not null"`
	HeartbeatAt time.Time `gorm:"type:datetime(6);not null;index"`
}

// TableName fixes the table's name.
func (Replica) TableName() string { return "replicas" }
