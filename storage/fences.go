package storage

import (
	"context"

	"gorm.io/gorm"
)

// fenceLockName is the meta row naming the lock backend whose tokens the
// SKUs' fences hold.
const fenceLockName = "fence_lock"

// AdoptFences makes the SKUs' fences count in lock's tokens. Each backend
// numbers its grants in its own space (a ZooKeeper czxid is at least 2^32,
// a Redis counter starts at 1 per key), so after the fleet moves to another
// backend the old fences would refuse every fenced write and every reset
// for good. The first replica of the new backend sets them back to 0: the
// old backend's holders are gone by then (a replica with other settings
// does not start while one of them lives, order.ErrMixedSettings). A
// database that never recorded its backend adopts lock as it stands.
// It reports whether the fences were reset.
func (s *Store) AdoptFences(ctx context.Context, lock string) (reset bool, err error) {
	db := s.db.WithContext(ctx)
	if err := db.Exec("INSERT IGNORE INTO meta (name, value) VALUES (?, ?)", fenceLockName, lock).Error; err != nil {
		return false, err
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		var cur string
		if err := tx.Raw("SELECT value FROM meta WHERE name = ? FOR UPDATE", fenceLockName).Row().Scan(&cur); err != nil || cur == lock {
			return err
		}
		if err := tx.Exec("UPDATE inventory SET fence = 0 WHERE fence <> 0").Error; err != nil {
			return err
		}
		reset = true
		return tx.Exec("UPDATE meta SET value = ? WHERE name = ?", lock, fenceLockName).Error
	})
	return reset, err
}
