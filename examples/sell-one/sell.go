package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/oversold-lab/oversold/locking"
)

// Schema is the stock table: version for guard version, fence for fencing.
const Schema = `CREATE TABLE IF NOT EXISTS stock (sku VARCHAR(64) PRIMARY KEY,
	quantity INT NOT NULL, version BIGINT NOT NULL DEFAULT 0, fence BIGINT UNSIGNED NOT NULL DEFAULT 0)`

// ErrSoldOut: no stock. ErrRefused: the guard refused the write (another
// holder wrote since our read, or our lease was lost); nothing was written.
var ErrSoldOut, ErrRefused = errors.New("sold out"), errors.New("refused by the guard")

// Sell sells one unit of sku. guard is "version", "fencing" (locker's
// tokens must be safe: redis, zookeeper, mysql, etcd) or "atomic" (no lock).
func Sell(ctx context.Context, locker locking.Locker, db *sql.DB, guard, sku string) error {
	if guard == "atomic" { // one conditional decrement: no lock, no read
		res, err := db.ExecContext(ctx, `UPDATE stock SET quantity = quantity - 1 WHERE sku = ? AND quantity >= 1`, sku)
		return none(res, err, ErrSoldOut)
	}
	lease, err := locker.Acquire(ctx, "sku/"+sku)
	if err != nil {
		return err
	}
	defer func() { // runs last: after the commit, on a fresh bounded context
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lease.Release(rctx) // ErrNotHeld if lost meanwhile: the guard decided
	}()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var qty, version int64
	if err := tx.QueryRowContext(ctx, `SELECT quantity, version FROM stock WHERE sku = ?`, sku).Scan(&qty, &version); err != nil {
		return err
	} else if qty < 1 {
		return ErrSoldOut
	}
	select { // ... your business logic; then a lease known lost must not write
	case <-lease.Lost():
		return ErrRefused
	default:
	}
	var res sql.Result
	switch guard {
	case "version":
		res, err = tx.ExecContext(ctx, `UPDATE stock SET quantity = ?, version = version + 1
			WHERE sku = ? AND version = ?`, qty-1, sku, version)
	case "fencing":
		res, err = tx.ExecContext(ctx, `UPDATE stock SET quantity = ?, version = version + 1, fence = ?
			WHERE sku = ? AND fence < ? AND version = ?`, qty-1, lease.Token(), sku, lease.Token(), version)
	default:
		return fmt.Errorf("guard %q: want version, fencing or atomic", guard)
	}
	if err := none(res, err, ErrRefused); err != nil {
		return err
	}
	return tx.Commit() // insert your order row before this, in the same transaction
}

// none returns ifNone when the UPDATE matched no row.
func none(res sql.Result, err, ifNone error) error {
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errors.Join(ifNone, err)
	}
	return nil
}
