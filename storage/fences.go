package storage

import (
	"context"
	"strconv"

	"gorm.io/gorm"
)

// The meta rows naming the lock backend whose tokens the fences hold (its
// name, and the identity of its servers' data: locking.Identifier, "" for
// a backend without one), and the fence epoch: a number AdoptFences raises
// each time either changes.
const (
	fenceLockName   = "fence_lock"
	fenceLockIDName = "fence_lock_id"
	fenceEpochName  = "fence_epoch"
)

// fenceBelow reports whether the fence (rowEpoch, rowToken) is below the
// write's (epoch, token): whether the fencing guard lets the write pass.
//
// A fence is the pair (epoch, token), compared epoch first: every fenced
// write carries the epoch its replica adopted (AdoptFences) with its
// lease's token, and raises the row's pair to it. Each backend numbers
// its grants in its own space (ZooKeeper's zxids, a Redis counter from 1
// per key), so tokens of two backends must never be compared: the epoch
// orders them instead. Any token of the current epoch
// beats any fence an older epoch's writer left, and a writer of an older
// epoch (a replica of the old backend that was frozen, or cut off from
// MySQL, past the replicas' liveness window) is refused by every fence
// the current epoch wrote or AdoptFences moved to it.
func fenceBelow(rowEpoch, rowToken, epoch, token uint64) bool {
	return rowEpoch < epoch || rowEpoch == epoch && rowToken < token
}

// AdoptFences makes the fences count in the tokens of backend lock, on the
// servers whose data has identity id (locking.IdentityOf), and returns the
// fence epoch that its writes carry. A database that never recorded its
// backend adopts it as it stands, at epoch 0; one that recorded only a
// name (before identities were recorded) adopts id for that name alike.
// When the fleet moves to another backend, or to other servers of the same
// backend (a new etcd cluster or ZooKeeper ensemble, a Redis that lost its
// data: each counts its tokens again from low numbers, below the fences
// the old one wrote), the first replica of the new one raises the epoch
// and moves every fence (the SKUs' and the fences table's) to (new epoch,
// 0), in one transaction with the meta rows, so its tokens pass at once
// and a straggler of the old backend finds every fence above its epoch:
// refused, whenever it writes. A replica with another lock name does not
// start while one of the old backend's replicas is live
// (order.ErrMixedSettings), but one frozen past the liveness window is not
// seen; the epoch is what fences it off. It reports whether the epoch
// moved.
func (s *Store) AdoptFences(ctx context.Context, lock, id string) (epoch uint64, reset bool, err error) {
	db := s.db.WithContext(ctx)
	err = db.Exec("INSERT IGNORE INTO meta (name, value) VALUES (?, ?), (?, ?), (?, '0')",
		fenceLockName, lock, fenceLockIDName, id, fenceEpochName).Error
	if err != nil {
		return 0, false, err
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		var cur, curID, e string
		for _, row := range []struct {
			name string
			dst  *string
		}{{fenceLockName, &cur}, {fenceLockIDName, &curID}, {fenceEpochName, &e}} {
			if err := tx.Raw("SELECT value FROM meta WHERE name = ? FOR UPDATE", row.name).Row().Scan(row.dst); err != nil {
				return err
			}
		}
		var err error
		if epoch, err = strconv.ParseUint(e, 10, 64); err != nil || cur == lock && curID == id {
			return err
		}
		epoch++
		for _, q := range []string{
			"UPDATE inventory SET fence = 0, fence_epoch = ? WHERE fence_epoch < ?",
			"UPDATE fences SET fence = 0, epoch = ? WHERE epoch < ?",
		} {
			if err := tx.Exec(q, epoch, epoch).Error; err != nil {
				return err
			}
		}
		// The sweeper's row, if no sweeper ever wrote it: a straggler
		// sweeper of the old backend must find it above its epoch.
		err = tx.Exec("INSERT IGNORE INTO fences (name, fence, epoch, writes) VALUES (?, 0, ?, 0)", SweeperFence, epoch).Error
		if err != nil {
			return err
		}
		for name, value := range map[string]string{fenceLockName: lock, fenceLockIDName: id, fenceEpochName: strconv.FormatUint(epoch, 10)} {
			if err := tx.Exec("UPDATE meta SET value = ? WHERE name = ?", value, name).Error; err != nil {
				return err
			}
		}
		reset = true
		return nil
	})
	if err != nil {
		return 0, false, err
	}
	return epoch, reset, nil
}

// Fences returns the backend whose tokens the fences count in now (meta's
// fence_lock and fence_lock_id, "" before any replica adopted them) and
// their epoch; it never adopts. A replica of that backend and identity
// refreshes with it the epoch it adopted at its start, in case the fleet
// left its backend and came back to it meanwhile; a replica of another
// backend, or of other servers, is superseded: the fences refuse its
// tokens, and it leaves the balancer (order/ready.go).
func (s *Store) Fences(ctx context.Context) (lock, id string, epoch uint64, err error) {
	// One statement: the rows as of one snapshot.
	var rows []Meta
	err = s.db.WithContext(ctx).Raw("SELECT name, value FROM meta WHERE name IN (?, ?, ?)",
		fenceLockName, fenceLockIDName, fenceEpochName).Scan(&rows).Error
	if err != nil {
		return "", "", 0, err
	}
	var e string
	for _, r := range rows {
		switch r.Name {
		case fenceLockName:
			lock = r.Value
		case fenceLockIDName:
			id = r.Value
		default:
			e = r.Value
		}
	}
	if e == "" {
		return lock, id, 0, nil
	}
	epoch, err = strconv.ParseUint(e, 10, 64)
	return lock, id, epoch, err
}
