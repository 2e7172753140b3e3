package storage

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
)

// Reservation statuses (docs/design.md, "Reservations"). A reservation
// leaves StatusHeld once, for one of the other three.
const (
	StatusHeld      = "held"
	StatusCancelled = "cancelled"
	StatusExpired   = "expired"
	// StatusConfirmed is shared with orders.
)

var (
	// ErrNoReservation: no reservation with that id or key.
	ErrNoReservation = errors.New("storage: reservation not found")
	// ErrSettled: the reservation is no longer held, or (DB clock) past
	// its expires_at; Settle returns it wrapped with the row as it is.
	ErrSettled = errors.New("storage: reservation not held")
	// ErrStaleSweeper: the sweeper fence found an expiry by a newer
	// sweeper; unlike a SKU's ErrStaleFence, it says the whole pass is
	// stale.
	ErrStaleSweeper = errors.New("storage: stale sweeper token")
)

// OutOfStock is ErrOutOfStock naming the SKUs of the lines whose stock
// did not cover them, in the order of the request's lines (the client's
// own SKUs: it carries no stock figure).
type OutOfStock struct{ SKUs []string }

func (e *OutOfStock) Error() string {
	return strings.Join(e.SKUs, ", ") + ": " + ErrOutOfStock.Error()
}

// Unwrap makes errors.Is(err, ErrOutOfStock) hold.
func (e *OutOfStock) Unwrap() error { return ErrOutOfStock }

// Line is one SKU of a reservation, with the fencing token of the lease
// it was held under (0: none).
type Line struct {
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
	Token    uint64 `json:"token,omitempty"`
}

// Lines is a reservation's lines, kept as one JSON column: a reservation
// is read and settled whole, never line by line.
type Lines []Line

// SKUs returns the lines' SKUs, in line order.
func (l Lines) SKUs() []string {
	skus := make([]string, len(l))
	for i, line := range l {
		skus[i] = line.SKU
	}
	return skus
}

// Value stores the lines as JSON.
func (l Lines) Value() (driver.Value, error) {
	b, err := json.Marshal([]Line(l))
	return string(b), err
}

// Scan reads the lines back.
func (l *Lines) Scan(v any) error {
	var b []byte
	switch v := v.(type) {
	case []byte:
		b = v
	case string:
		b = []byte(v)
	default:
		return fmt.Errorf("lines: cannot scan %T", v)
	}
	return json.Unmarshal(b, (*[]Line)(l))
}

// Reservation is stock held for a checkout. ExpiresAt is set by MySQL's
// clock (UTC_TIMESTAMP(6) + the TTL), the one clock every replica shares;
// SettledAt and SettledBy say when and by which replica it left held. The
// key, id and SKUs are exact byte strings (docs/design.md, "Identity").
type Reservation struct {
	ID             string     `gorm:"type:varbinary(36);primaryKey"` // UUIDv7
	Status         string     `gorm:"type:varchar(16);not null;index:due,priority:1"`
	Lines          Lines      `gorm:"type:text;not null"`
	ExpiresAt      time.Time  `gorm:"type:datetime(6);not null;index:due,priority:2"`
	Instance       string     `gorm:"type:varchar(255);not null"` // the replica that held it
	Lock           string     `gorm:"type:varchar(16);not null"`
	Token          uint64     `gorm:"not null"` // the highest token of its leases
	IdempotencyKey *string    `gorm:"type:varbinary(255);uniqueIndex"`
	Fingerprint    []byte     `gorm:"type:varbinary(32)"`
	CreatedAt      time.Time  `gorm:"type:datetime(6);not null"`
	SettledAt      *time.Time `gorm:"type:datetime(6)"`
	SettledBy      string     `gorm:"type:varchar(255);not null;default:''"`
	// Due: held and past expires_at by MySQL's clock when it was read (no
	// column: computed by every read, see withDue). A due hold is expired
	// for every purpose but its stock, which a sweeper gives back.
	Due bool `gorm:"->;-:migration"`
}

// TableName fixes the table's name: the lab reads it.
func (Reservation) TableName() string { return "reservations" }

// Fence is a named fencing counter for writers that are not a SKU's: the
// sweeper's (SweeperFence). A write under (epoch, token) passes only if no
// write under a greater pair came before (see fenceBelow). One row serves
// every backend, since the epoch orders their tokens; AdoptFences moves it
// to (new epoch, 0), creating it if no sweeper ever wrote it: a switch of
// backend neither leaves the new sweeper fenced off by the old one's
// larger numbers nor lets a straggler of the old backend sweep on, even
// one whose backend never wrote the row (with a row per backend, such
// a straggler would create its own and pass).
type Fence struct {
	Name   string `gorm:"type:varbinary(64);primaryKey"`
	Fence  uint64 `gorm:"not null"`
	Epoch  uint64 `gorm:"not null;default:0"`
	Writes uint64 `gorm:"not null"` // bumped by every write, so a pass always changes the row
}

// TableName fixes the table's name.
func (Fence) TableName() string { return "fences" }

// ReservationMove is one line of the reservations' stock ledger: the change
// a transition meant to make to one SKU's row, written in the transition's
// own transaction. The status change lets a reservation leave held once, so
// a reservation has one hold per line and at most one give-back (cancel or
// expire) per line; the lab counts them (a double give-back is two), and
// compares each SKU's row with the sum of its ledger (a guarded write from
// a stale read changes the row by another amount than the ledger says).
type ReservationMove struct {
	ID            uint64    `gorm:"primaryKey;autoIncrement"`
	ReservationID string    `gorm:"type:varbinary(36);not null;index"`
	SKU           string    `gorm:"type:varbinary(64);not null;index"`
	Op            string    `gorm:"type:varchar(16);not null"` // hold, confirm, cancel, expire
	Stock         int64     `gorm:"not null"`
	Reserved      int64     `gorm:"not null"`
	Instance      string    `gorm:"type:varchar(255);not null"`
	Token         uint64    `gorm:"not null"`
	CreatedAt     time.Time `gorm:"type:datetime(6);not null"`
}

// TableName fixes the table's name: the lab reads it.
func (ReservationMove) TableName() string { return "reservation_moves" }

// Ops of the ledger, by the status a transition moves to.
var moveOp = map[string]string{
	StatusHeld: "hold", StatusConfirmed: "confirm", StatusCancelled: "cancel", StatusExpired: "expire",
}

// SweeperFence is the name of the Fence of the lock `sweeper`, on every
// backend. Rows of older versions, one per backend ("sweeper/<lock>"),
// are left as they are: nothing reads them.
const SweeperFence = "sweeper"

// ReservationFingerprint is a hold request's Fingerprint: its lines sorted
// by SKU (their order is the client's, not a difference) and its TTL in
// seconds (0: the default).
func ReservationFingerprint(lines []Line, ttlSeconds int64) []byte {
	sorted := slices.Clone(lines)
	slices.SortFunc(sorted, func(a, b Line) int { return strings.Compare(a.SKU, b.SKU) })
	fields := []string{strconv.FormatInt(ttlSeconds, 10)}
	for _, l := range sorted {
		fields = append(fields, l.SKU, strconv.FormatInt(l.Quantity, 10))
	}
	return Fingerprint("reservation", fields...)
}

// Move is one line's guarded write of a reservation transition: the SKU's
// row as the caller read it under its lease (Seen), the lease's token, and
// the change of stock and reserved. The guard applies as in PlaceOrder:
// none writes Seen + change; version also requires Seen.Version; fencing
// requires a fence below (Epoch, Token) and raises it, and Seen.Version
// too; atomic adds the change in place, refused when either would go
// negative.
type Move struct {
	Seen     Inventory
	Epoch    uint64 // the fence epoch of the lease's backend (Write.Epoch)
	Token    uint64
	Stock    int64 // change of stock: -q to hold, +q to give back
	Reserved int64 // change of reserved: +q to hold, -q to settle
}

// Hold inserts r (status held, expires ttl after MySQL's now) and writes
// every move under guard, in one transaction: all or nothing. It returns
// the reservation as stored and the SKUs' rows after the writes.
//
// A refused guard returns ErrConflict (version, or fencing on a stale
// read), ErrStaleFence (fencing) or ErrOutOfStock (atomic); a missing SKU ErrUnknownSKU; a key already
// used, by a reservation or an order, ErrDuplicate (claimKeys). In every
// error case nothing was written.
func (s *Store) Hold(ctx context.Context, guard Guard, r Reservation, ttl time.Duration, moves []Move) (Reservation, []Inventory, error) {
	var after []Inventory
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if r.IdempotencyKey != nil {
			if err := claimKeys(tx, KindReservation, []string{*r.IdempotencyKey}, []string{r.ID}); err != nil {
				return err
			}
		}
		err := tx.Exec("INSERT INTO reservations (id, status, `lines`, expires_at, instance, `lock`, token, idempotency_key, fingerprint, created_at, settled_by) "+
			"VALUES (?, ?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), '')",
			r.ID, StatusHeld, r.Lines, ttl.Microseconds(), r.Instance, r.Lock, r.Token, r.IdempotencyKey, r.Fingerprint).Error
		if mysqlErrno(err) == errDupEntry {
			return fmt.Errorf("%w: %w", ErrDuplicate, err)
		}
		if err != nil {
			return err
		}
		if after, err = applyMoves(ctx, tx, guard, ledger{r.ID, StatusHeld, r.Instance}, moves); err != nil {
			return err
		}
		return withDue(tx).Take(&r, "id = ?", r.ID).Error
	})
	if err != nil {
		return Reservation{}, nil, fmt.Errorf("hold: %w", deadlock(err))
	}
	return r, after, nil
}

// Settlement is a reservation leaving held: to confirmed (Orders are
// inserted, one per line), cancelled or expired (the stock goes back).
// SweepToken, for an expiry by a sweeper holding the lock `sweeper` with a
// token, is checked with SweepEpoch (the fence epoch of its backend)
// against the SweeperFence row in the same transaction.
type Settlement struct {
	ID         string
	To         string // StatusConfirmed, StatusCancelled or StatusExpired
	By         string // the replica
	Orders     []Order
	SweepEpoch uint64
	SweepToken uint64
}

// Settle moves reservation st.ID out of held and writes every move under
// guard, in one transaction. The status change comes first and is
// conditional on held and on MySQL's clock: confirm and cancel only before
// expires_at, expire only from it on. When it changes no row, nothing is
// written and the error wraps ErrSettled, with the reservation as it is
// (ErrNoReservation if there is none). Guard refusals are as in Hold; a
// sweeper fenced off by a newer one is ErrStaleSweeper.
func (s *Store) Settle(ctx context.Context, guard Guard, st Settlement, moves []Move) (Reservation, []Inventory, error) {
	var r Reservation
	var after []Inventory
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		clock := "expires_at > UTC_TIMESTAMP(6)"
		if st.To == StatusExpired {
			clock = "expires_at <= UTC_TIMESTAMP(6)"
		}
		res := tx.Exec("UPDATE reservations SET status = ?, settled_at = UTC_TIMESTAMP(6), settled_by = ? WHERE id = ? AND status = ? AND "+clock,
			st.To, st.By, st.ID, StatusHeld)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return ErrSettled
		}
		if st.SweepToken != 0 {
			// Inserted at the first write; afterwards changed (writes
			// grows) only under a pair at least the fence: 0 rows
			// affected is a refusal. MySQL assigns left to right, each
			// assignment seeing the ones before: epoch goes last.
			res := tx.Exec(`INSERT INTO fences (name, fence, epoch, writes) VALUES (?, ?, ?, 1)
				ON DUPLICATE KEY UPDATE writes = IF((epoch, fence) <= (VALUES(epoch), VALUES(fence)), writes + 1, writes),
					fence = IF((epoch, fence) <= (VALUES(epoch), VALUES(fence)), VALUES(fence), fence),
					epoch = GREATEST(epoch, VALUES(epoch))`,
				SweeperFence, st.SweepToken, st.SweepEpoch)
			if res.Error != nil {
				return res.Error
			}
			if res.RowsAffected == 0 {
				return fmt.Errorf("sweeper token %d: %w", st.SweepToken, ErrStaleSweeper)
			}
		}
		var err error
		if after, err = applyMoves(ctx, tx, guard, ledger{st.ID, st.To, st.By}, moves); err != nil {
			return err
		}
		if len(st.Orders) > 0 {
			if err := tx.Create(&st.Orders).Error; err != nil {
				return err
			}
		}
		return withDue(tx).Take(&r, "id = ?", st.ID).Error
	})
	if errors.Is(err, ErrSettled) {
		now, rerr := s.Reservation(ctx, st.ID)
		if rerr != nil {
			return Reservation{}, nil, rerr
		}
		return now, nil, fmt.Errorf("settle %s to %s: %w", st.ID, st.To, ErrSettled)
	}
	if err != nil {
		return Reservation{}, nil, fmt.Errorf("settle %s to %s: %w", st.ID, st.To, deadlock(err))
	}
	return r, after, nil
}

// ledger names the transition whose moves applyMoves writes.
type ledger struct{ reservation, to, instance string }

// applyMoves runs every move's guarded write, and its line of the ledger,
// and returns the rows after them, read inside the transaction (the rows
// are locked until commit). The rows are written in SKU order, as the
// locks are taken: two transactions never wait for each other's rows in a
// cycle.
func applyMoves(ctx context.Context, tx *gorm.DB, guard Guard, l ledger, moves []Move) ([]Inventory, error) {
	g, err := guard.rule()
	if err != nil {
		return nil, err
	}
	moves = slices.Clone(moves)
	slices.SortFunc(moves, func(a, b Move) int { return strings.Compare(a.Seen.SKU, b.Seen.SKU) })
	after := make([]Inventory, 0, len(moves))
	for _, m := range moves {
		sku := m.Seen.SKU
		query, args := g.move(m)
		res, err := tx.Statement.ConnPool.ExecContext(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		if n, err := res.RowsAffected(); err != nil {
			return nil, err
		} else if n == 0 {
			err := refusal(tx, g, sku, m.Epoch, m.Token)
			if errors.Is(err, ErrOutOfStock) {
				return nil, &OutOfStock{SKUs: []string{sku}}
			}
			return nil, fmt.Errorf("%q: %w", sku, err)
		}
		_, err = tx.Statement.ConnPool.ExecContext(ctx, "INSERT INTO reservation_moves (reservation_id, sku, op, stock, reserved, instance, token, created_at) "+
			"VALUES (?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))", l.reservation, sku, moveOp[l.to], m.Stock, m.Reserved, l.instance, m.Token)
		if err != nil {
			return nil, err
		}
		var inv Inventory
		if err := tx.Take(&inv, "sku = ?", sku).Error; err != nil {
			return nil, err
		}
		after = append(after, inv)
	}
	return after, nil
}

// deadlock turns MySQL's deadlock victim into ErrConflict: nothing was
// written, the whole transition may run again.
func deadlock(err error) error {
	if mysqlErrno(err) == errLockDeadlock {
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	return err
}

// Reservation returns the reservation with id.
func (s *Store) Reservation(ctx context.Context, id string) (Reservation, error) {
	return s.takeReservation(ctx, "id = ?", id)
}

// ReservationByKey returns the reservation held with an idempotency key.
func (s *Store) ReservationByKey(ctx context.Context, key string) (Reservation, error) {
	return s.takeReservation(ctx, "idempotency_key = ?", key)
}

func (s *Store) takeReservation(ctx context.Context, where, arg string) (Reservation, error) {
	var r Reservation
	err := withDue(s.db.WithContext(ctx)).Take(&r, where, arg).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Reservation{}, ErrNoReservation
	}
	return r, err
}

// withDue reads reservations with Due, by MySQL's clock.
func withDue(db *gorm.DB) *gorm.DB {
	return db.Select("*, (status = ? AND expires_at <= UTC_TIMESTAMP(6)) AS due", StatusHeld)
}

// ReservationOrders returns the ids of the orders a confirmed reservation
// made, in line order (their ids are UUIDv7, made in that order).
func (s *Store) ReservationOrders(ctx context.Context, id string) ([]string, error) {
	ids := []string{}
	err := s.db.WithContext(ctx).Model(&Order{}).Where("reservation_id = ?", id).Order("id").Pluck("id", &ids).Error
	return ids, err
}

// DueReservations returns at most limit held reservations past their
// expires_at by MySQL's clock, the oldest due first, from the first after
// the reservation after on (its ExpiresAt and ID; the zero Reservation:
// from the oldest), with their IDs, ExpiresAt and Lines. A sweeper passes
// the last one it got to read on past due holds that it could not expire.
func (s *Store) DueReservations(ctx context.Context, after Reservation, limit int) ([]Reservation, error) {
	due := []Reservation{}
	q := s.db.WithContext(ctx).Select("id", "expires_at", "lines").
		Where("status = ? AND expires_at <= UTC_TIMESTAMP(6)", StatusHeld)
	if after.ID != "" {
		q = q.Where("(expires_at > ? OR (expires_at = ? AND id > ?))", after.ExpiresAt, after.ExpiresAt, after.ID)
	}
	err := q.Order("expires_at, id").Limit(limit).Find(&due).Error
	return due, err
}

// SweepState is what the sweeper's metrics show: the stock reservations
// hold now, and how long the oldest due hold has been due (0: none).
type SweepState struct {
	Reserved int64
	Lag      time.Duration
}

// SweepState reads the stock held and the sweep lag, by MySQL's clock.
func (s *Store) SweepState(ctx context.Context) (SweepState, error) {
	var st SweepState
	db := s.db.WithContext(ctx)
	if err := db.Raw("SELECT COALESCE(SUM(reserved), 0) FROM inventory").Row().Scan(&st.Reserved); err != nil {
		return st, err
	}
	var lagMicros *int64
	err := db.Raw("SELECT TIMESTAMPDIFF(MICROSECOND, MIN(expires_at), UTC_TIMESTAMP(6)) FROM reservations WHERE status = ? AND expires_at <= UTC_TIMESTAMP(6)", StatusHeld).
		Row().Scan(&lagMicros)
	if lagMicros != nil {
		st.Lag = time.Duration(*lagMicros) * time.Microsecond
	}
	return st, err
}
