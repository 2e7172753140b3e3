package storage

import (
	"context"
	"strconv"

	"gorm.io/gorm"
)

// The meta rows naming the fleet the fences belong to (Fleet: the lock
// backend whose tokens they hold, the identity of its servers' data, and
// the guard of the replicas that write them), and the fence epoch: a
// number AdoptFences raises each time one of them changes.
const (
	fenceLockName   = "fence_lock"
	fenceLockIDName = "fence_lock_id"
	fleetGuardName  = "fleet_guard"
	fenceEpochName  = "fence_epoch"
)

// Fleet is the settings of the replicas the fences belong to: the lock
// backend whose tokens they count in, the identity of its servers' data
// (locking.IdentityOf, "" for a backend without one), and the guard those
// replicas run. A replica with other settings is superseded once the epoch
// is above its own (order/ready.go).
type Fleet struct {
	Lock   string
	LockID string
	Guard  string
}

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

// AdoptFences makes the fences belong to fleet f and returns the fence
// epoch that its writes carry. A database that never recorded its fleet
// adopts f as it stands, at epoch 0; one that recorded only a lock name
// (before identities and guards were recorded) adopts f's identity and
// guard for that name alike. When the fleet moves to another backend, to
// other servers of the same backend (a new etcd cluster or ZooKeeper
// ensemble, a Redis that lost its data: each counts its tokens again from
// low numbers, below the fences the old one wrote), or to another guard,
// the first replica of the new fleet raises the epoch and moves every
// fence (the SKUs' and the fences table's) to (new epoch, 0), in one
// transaction with the meta rows, so its tokens pass at once and a
// straggler of the old fleet finds every fence above its epoch: refused,
// whenever it writes. A replica with other settings does not start while
// one of the old fleet's replicas is live (order.ErrMixedSettings), but
// one frozen past the liveness window is not seen; the epoch is what
// fences it off, and what tells it to withdraw. It reports whether the
// epoch moved.
func (s *Store) AdoptFences(ctx context.Context, f Fleet) (epoch uint64, reset bool, err error) {
	epoch, reset, _, err = s.adoptFences(ctx, f, 0, false)
	return epoch, reset, err
}

// ReclaimFences is a running replica's adoption, for meta that lost it: a
// failover to an asynchronous replica that had not applied the adoption,
// or a restore, left meta naming another fleet at an epoch not above held
// (the epoch this replica carries), or its own fleet below held. Without
// such a loss meta's epoch only grows, and another fleet at an epoch above
// held superseded this replica: then it changes nothing and reports
// superseded. Otherwise the fences belong to f again, at held, or above
// meta's epoch if meta named another fleet (a replica of it may have
// written at that epoch): never below held, where this replica's own
// fences would refuse it.
func (s *Store) ReclaimFences(ctx context.Context, f Fleet, held uint64) (epoch uint64, superseded bool, err error) {
	epoch, _, superseded, err = s.adoptFences(ctx, f, held, true)
	return epoch, superseded, err
}

func (s *Store) adoptFences(ctx context.Context, f Fleet, held uint64, reclaim bool) (epoch uint64, reset, superseded bool, err error) {
	db := s.db.WithContext(ctx)
	err = db.Exec("INSERT IGNORE INTO meta (name, value) VALUES (?, ?), (?, ?), (?, ?), (?, '0')",
		fenceLockName, f.Lock, fenceLockIDName, f.LockID, fleetGuardName, f.Guard, fenceEpochName).Error
	if err != nil {
		return 0, false, false, err
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		var cur Fleet
		var e string
		for _, row := range []struct {
			name string
			dst  *string
		}{{fenceLockName, &cur.Lock}, {fenceLockIDName, &cur.LockID}, {fleetGuardName, &cur.Guard}, {fenceEpochName, &e}} {
			if err := tx.Raw("SELECT value FROM meta WHERE name = ? FOR UPDATE", row.name).Row().Scan(row.dst); err != nil {
				return err
			}
		}
		var err error
		if epoch, err = strconv.ParseUint(e, 10, 64); err != nil {
			return err
		}
		switch {
		case cur == f && epoch >= held:
			return nil
		case cur == f:
			epoch = held
		case reclaim && epoch > held:
			superseded = true
			return nil
		default:
			epoch = max(epoch+1, held)
		}
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
		for name, value := range map[string]string{fenceLockName: f.Lock, fenceLockIDName: f.LockID, fleetGuardName: f.Guard, fenceEpochName: strconv.FormatUint(epoch, 10)} {
			if err := tx.Exec("UPDATE meta SET value = ? WHERE name = ?", value, name).Error; err != nil {
				return err
			}
		}
		reset = true
		return nil
	})
	if err != nil {
		return 0, false, false, err
	}
	return epoch, reset, superseded, nil
}

// refuseOlderEpoch refuses, with ErrStaleFence, a fenced write whose epoch
// is below the fences' own: a straggler's, of a fleet that was superseded
// while it was away. The row's fence refuses it where the current epoch
// wrote, or AdoptFences moved it; this refuses it where neither did, such
// as a SKU it would create (or it would create one and sell on it,
// beside the current fleet). Share-locked, before any inventory row: an
// adoption (which locks meta first too) waits for the write's commit and
// then moves what it wrote, or the write waits for the adoption and is
// refused.
func refuseOlderEpoch(tx *gorm.DB, epoch uint64) error {
	var rows []Meta
	if err := tx.Raw("SELECT name, value FROM meta WHERE name = ? LOCK IN SHARE MODE", fenceEpochName).Scan(&rows).Error; err != nil {
		return err
	}
	if len(rows) == 0 { // no fleet adopted the fences yet
		return nil
	}
	cur, err := strconv.ParseUint(rows[0].Value, 10, 64)
	if err != nil {
		return err
	}
	if epoch < cur {
		return ErrStaleFence
	}
	return nil
}

// Fences returns the fleet the fences belong to now (meta's fence_lock,
// fence_lock_id and fleet_guard, "" before any replica adopted them) and
// their epoch; it never adopts. A replica of that fleet refreshes with it
// the epoch it adopted at its start, in case the fleet left its settings
// and came back to them meanwhile; a replica of other settings (another
// backend, other servers, another guard) is superseded once the epoch is
// above its own: the fences refuse its tokens, and it withdraws
// (order/ready.go).
func (s *Store) Fences(ctx context.Context) (f Fleet, epoch uint64, err error) {
	// One statement: the rows as of one snapshot.
	var rows []Meta
	err = s.db.WithContext(ctx).Raw("SELECT name, value FROM meta WHERE name IN (?, ?, ?, ?)",
		fenceLockName, fenceLockIDName, fleetGuardName, fenceEpochName).Scan(&rows).Error
	if err != nil {
		return Fleet{}, 0, err
	}
	var e string
	for _, r := range rows {
		switch r.Name {
		case fenceLockName:
			f.Lock = r.Value
		case fenceLockIDName:
			f.LockID = r.Value
		case fleetGuardName:
			f.Guard = r.Value
		default:
			e = r.Value
		}
	}
	if e == "" {
		return f, 0, nil
	}
	epoch, err = strconv.ParseUint(e, 10, 64)
	return f, epoch, err
}
