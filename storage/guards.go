package storage

import (
	"fmt"
	"slices"
)

// Guard is the condition the stock write of step 6 is made under, by its
// name: the spelling of OVERSOLD_GUARD, of the JSON and of the metrics.
// What a guard does (its UPDATE, why it refused, what it trusts) is its
// rule, one type per guard below; rule is the one place a name picks one.
type Guard string

// The four guards of docs/design.md.
const (
	GuardNone    Guard = "none"    // trust the lock alone
	GuardVersion Guard = "version" // optimistic: the row's version must be the one read
	GuardFencing Guard = "fencing" // the lease's token must be newer than the last writer's, and the row the one read
	GuardAtomic  Guard = "atomic"  // decrement in place if enough stock: no lock needed
)

// Guards lists every guard.
var Guards = []Guard{GuardNone, GuardVersion, GuardFencing, GuardAtomic}

// ParseGuard returns the guard named s.
func ParseGuard(s string) (Guard, error) {
	if g := Guard(s); slices.Contains(Guards, g) {
		return g, nil
	}
	return "", fmt.Errorf("unknown guard %q (want one of none, version, fencing, atomic)", s)
}

// TrustsCache reports whether the guard builds its write on the cached
// read: none, which never checks it, and fencing, whose version check
// refuses a stale one (a stale entry would cost it a retry per holder).
// The flow deletes the entry before such a write, and refuses to sell
// without the cache.
func (g Guard) TrustsCache() bool { r, err := g.rule(); return err == nil && r.trustsCache() }

// Fenced reports whether the guard's write carries the lease's fencing
// token and raises the row's fence to it: it needs a lock with tokens.
func (g Guard) Fenced() bool { r, err := g.rule(); return err == nil && r.fenced() }

// Checks reports whether the guard's write checks anything MySQL holds:
// every guard but none, which trusts the lock (and the stock gate).
func (g Guard) Checks() bool { r, err := g.rule(); return err == nil && r.checks() }

// rule is what one guard does: the SQL of its writes, exactly as
// docs/design.md states them, and why one of them changed no row.
type rule interface {
	// update is the write of step 6 (PlaceOrder). Every guard bumps
	// version (the cache orders its entries by it) through
	// LAST_INSERT_ID(version + 1): MySQL returns the new version as the
	// UPDATE's insert id, which spares a read-back inside the
	// transaction, while the row is locked.
	update(w Write) (query string, args []any)
	// move is the write of one reservation move (applyMoves).
	move(m Move) (query string, args []any)
	// refuse tells why a write of this guard under the lease's (epoch,
	// token) changed no row of an SKU that exists, as row is now.
	refuse(row Inventory, epoch, token uint64) error
	// insertFirst: PlaceOrder inserts the orders before the UPDATE,
	// which then holds the row's lock for less time.
	insertFirst() bool
	// inPlace: w's UPDATE decrements the row's stock rather than writing
	// the stock read, so the stock after it is known only when no write
	// came between the read and ours.
	inPlace(w Write) bool
	trustsCache() bool // see Guard.TrustsCache
	fenced() bool      // see Guard.Fenced
	checks() bool      // see Guard.Checks
}

// rules is every guard's rule by its name.
var rules = map[Guard]rule{GuardNone: noneGuard{}, GuardVersion: versionGuard{}, GuardFencing: fencingGuard{}, GuardAtomic: atomicGuard{}}

// rule returns g's rule.
func (g Guard) rule() (rule, error) {
	if r, ok := rules[g]; ok {
		return r, nil
	}
	return nil, fmt.Errorf("unknown guard %q", g)
}

// noneGuard writes the stock read and checks nothing: it trusts the lock.
// Behind the stock gate it decrements in place instead (Write.Decrement),
// as the flash-sale systems that trust their gate do.
type noneGuard struct{}

func (noneGuard) update(w Write) (string, []any) {
	if w.Decrement {
		return `UPDATE inventory SET stock = stock - ?, version = LAST_INSERT_ID(version + 1), updated_at = UTC_TIMESTAMP(6)
			WHERE sku = ?`, []any{w.quantity(), w.sku()}
	}
	return `UPDATE inventory SET stock = ?, version = LAST_INSERT_ID(version + 1), updated_at = UTC_TIMESTAMP(6)
			WHERE sku = ?`, []any{w.Stock - w.quantity(), w.sku()}
}

func (noneGuard) move(m Move) (string, []any) {
	return `UPDATE inventory SET stock = ?, reserved = ?, version = version + 1, updated_at = UTC_TIMESTAMP(6)
				WHERE sku = ?`, []any{m.Seen.Stock + m.Stock, m.Seen.Reserved + m.Reserved, m.Seen.SKU}
}

func (noneGuard) refuse(Inventory, uint64, uint64) error {
	return fmt.Errorf("guard %q changed no row of an existing SKU", GuardNone)
}

func (noneGuard) insertFirst() bool    { return true }
func (noneGuard) inPlace(w Write) bool { return w.Decrement }
func (noneGuard) trustsCache() bool    { return true }
func (noneGuard) fenced() bool         { return false }
func (noneGuard) checks() bool         { return false }

// versionGuard writes only if the row's version is still the one read.
type versionGuard struct{}

func (versionGuard) update(w Write) (string, []any) {
	return `UPDATE inventory SET stock = ?, version = LAST_INSERT_ID(version + 1), updated_at = UTC_TIMESTAMP(6)
			WHERE sku = ? AND version = ?`, []any{w.Stock - w.quantity(), w.sku(), w.Version}
}

func (versionGuard) move(m Move) (string, []any) {
	return `UPDATE inventory SET stock = ?, reserved = ?, version = version + 1, updated_at = UTC_TIMESTAMP(6)
				WHERE sku = ? AND version = ?`, []any{m.Seen.Stock + m.Stock, m.Seen.Reserved + m.Reserved, m.Seen.SKU, m.Seen.Version}
}

// refuse: someone wrote since the read.
func (versionGuard) refuse(Inventory, uint64, uint64) error { return ErrConflict }

// insertFirst is false: without a lock, racing replicas make the version
// guard refuse often (every stale read), and a refusal should not cost an
// INSERT and its undo.
func (versionGuard) insertFirst() bool  { return false }
func (versionGuard) inPlace(Write) bool { return false }
func (versionGuard) trustsCache() bool  { return false }
func (versionGuard) fenced() bool       { return false }
func (versionGuard) checks() bool       { return true }

// fencingGuard writes only under a lease whose (epoch, token) is above the
// row's fence (see fenceBelow), raising the fence to it, and only if the
// row's version is still the one read: a valid token on a stale read, as
// a cache that lost writes in a failover gives, must not write.
type fencingGuard struct{}

func (fencingGuard) update(w Write) (string, []any) {
	return `UPDATE inventory SET stock = ?, fence = ?, fence_epoch = ?, version = LAST_INSERT_ID(version + 1), updated_at = UTC_TIMESTAMP(6)
			WHERE sku = ? AND (fence_epoch, fence) < (?, ?) AND version = ?`,
		[]any{w.Stock - w.quantity(), w.Token, w.Epoch, w.sku(), w.Epoch, w.Token, w.Version}
}

func (fencingGuard) move(m Move) (string, []any) {
	return `UPDATE inventory SET stock = ?, reserved = ?, fence = ?, fence_epoch = ?, version = version + 1, updated_at = UTC_TIMESTAMP(6)
				WHERE sku = ? AND (fence_epoch, fence) < (?, ?) AND version = ?`,
		[]any{m.Seen.Stock + m.Stock, m.Seen.Reserved + m.Reserved, m.Token, m.Epoch, m.Seen.SKU, m.Epoch, m.Token, m.Seen.Version}
}

// refuse: a newer lock holder wrote (ErrStaleFence, the lease is lost), or
// the row moved on since the read (ErrConflict: a stale cache entry, to be
// read again under the same lock).
func (fencingGuard) refuse(row Inventory, epoch, token uint64) error {
	if !fenceBelow(row.FenceEpoch, row.Fence, epoch, token) {
		return ErrStaleFence
	}
	return ErrConflict
}

func (fencingGuard) insertFirst() bool  { return true }
func (fencingGuard) inPlace(Write) bool { return false }
func (fencingGuard) trustsCache() bool  { return true }
func (fencingGuard) fenced() bool       { return true }
func (fencingGuard) checks() bool       { return true }

// atomicGuard decrements in place if the stock is enough: it needs no lock.
type atomicGuard struct{}

func (atomicGuard) update(w Write) (string, []any) {
	q := w.quantity()
	return `UPDATE inventory SET stock = stock - ?, version = LAST_INSERT_ID(version + 1), updated_at = UTC_TIMESTAMP(6)
			WHERE sku = ? AND stock >= ?`, []any{q, w.sku(), q}
}

// move adds the change in place, refused when stock or reserved would go
// negative.
func (atomicGuard) move(m Move) (string, []any) {
	return `UPDATE inventory SET stock = stock + ?, reserved = reserved + ?, version = version + 1, updated_at = UTC_TIMESTAMP(6)
				WHERE sku = ? AND stock + ? >= 0 AND reserved + ? >= 0`, []any{m.Stock, m.Reserved, m.Seen.SKU, m.Stock, m.Reserved}
}

// refuse: not enough stock.
func (atomicGuard) refuse(Inventory, uint64, uint64) error { return ErrOutOfStock }

func (atomicGuard) insertFirst() bool  { return true }
func (atomicGuard) inPlace(Write) bool { return true }
func (atomicGuard) trustsCache() bool  { return false }
func (atomicGuard) fenced() bool       { return false }
func (atomicGuard) checks() bool       { return true }
