package order

import (
	"context"
	"errors"
	"fmt"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/storage"
)

// SetStock is an admin's reset of a SKU's sellable stock (PUT
// /v1/inventory/{sku}), creating the SKU if needed. It runs under the SKU's
// lock like an order, so no order's read-then-write straddles it; the
// write bumps the version (an order that read before it is refused by the
// version guard) and, under the fencing guard, raises the fence to the
// lease's token (a holder older than the reset is refused). ifVersion, when not 0,
// must be the SKU's current version, else storage.ErrPrecondition. The
// cache entry is overwritten, whatever version it claims.
func (s *Service) SetStock(ctx context.Context, sku string, stock int64, ifVersion uint64) (storage.Inventory, error) {
	if err := s.refuseIfWithdrawn(); err != nil {
		return storage.Inventory{}, err
	}
	put := storage.Put{SKU: sku, Stock: stock, IfVersion: ifVersion}
	var lease locking.Lease
	if s.locker != nil {
		var err error
		if lease, err = s.acquire(ctx, sku); err != nil {
			return storage.Inventory{}, err
		}
		defer s.release(ctx, lease, s.hold(lease))
		if err := s.beforeWrite(lost(lease), "reset"); err != nil {
			return storage.Inventory{}, err
		}
		if s.cfg.Guard.Fenced() { // only fenced writes read the fence
			put.Epoch, put.Token = s.epoch.Load(), lease.Token()
		}
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	// As a sale does: with a guard that trusts the cached read, the entry
	// goes before the write, so a reset whose Force below fails cannot
	// leave the next holder the old stock to write over it.
	if s.trustsCache() {
		if err := s.cache.Invalidate(wctx, sku); err != nil {
			return storage.Inventory{}, fmt.Errorf("%w: guard %s needs the stock cache: %w", ErrUnavailable, s.cfg.Guard, err)
		}
	}
	inv, err := s.store.PutInventory(wctx, put)
	if err != nil {
		switch {
		case errors.Is(err, storage.ErrStaleFence):
			err = fmt.Errorf("%w: %w", ErrLockLost, err)
		case errors.Is(err, storage.ErrPrecondition):
		default: // the outcome is unknown: the entry must not outlive the doubt
			s.refresh(wctx, sku, lease)
		}
		return storage.Inventory{}, err
	}
	s.skus.add(sku)
	item := toItem(inv)
	// The reset is committed: it is answered as done whatever happens to
	// the cache, as an order is (a 503 here told the admin that a reset
	// that happened had failed). An entry left behind is older than the
	// reset, as after an order's failed cache write: the version and
	// fencing guards refuse a write built on it and refresh it, the atomic
	// guard checks a short stock in MySQL; and it expires.
	if err := s.cache.Force(wctx, item); err != nil {
		s.log.Warn("cache write failed", "sku", sku, "version", item.Version, "err", err)
	}
	// The gate's counter follows the reset, less what is in flight (which
	// takes from the new stock as it commits). A failure leaves the old
	// counter until the reconciler.
	if s.cfg.Gate != nil {
		if err := s.cfg.Gate.Reset(wctx, sku, item.Stock); err != nil {
			s.log.Warn("gate reset failed", "sku", sku, "err", err)
		}
		// The key set restarts too: it grows by a key per keyed take, and
		// holds after its load only what MySQL does.
		if err := s.cfg.Gate.ResetKeys(wctx); err != nil {
			s.log.Warn("gate key set reset failed", "err", err)
		}
		s.gateKeys(wctx, false)
	}
	s.log.Info("inventory set", "sku", sku, "stock", item.Stock, "version", item.Version)
	return inv, nil
}
