package order

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/storage"
)

const (
	// heartbeatEvery and liveWithin: a replica counts as running while its
	// last heartbeat is younger than three periods.
	heartbeatEvery = 5 * time.Second
	liveWithin     = 15 * time.Second
	// readyTimeout bounds all the checks of one /readyz.
	readyTimeout = 2 * time.Second
)

// ErrMixedSettings: a live replica of the database runs another lock or
// guard. Behind one balancer they would not protect the same stock the same
// way (a bug seen in peer projects).
var ErrMixedSettings = errors.New("replicas of one database run other settings")

// Start announces this replica in the replicas table, with its lock and
// guard, and keeps heartbeating until Close. A replica that finds a live
// replica with other settings is the newcomer: Start withdraws it and
// returns ErrMixedSettings, and the replicas already serving go on. So a
// rolling update that changes the lock or guard stalls with the old
// replicas serving, and one that keeps them completes (deploy/k8s/README.md,
// "Rolling updates"). A dead replica's row stops counting liveWithin after
// its last heartbeat.
//
// Announcing before looking makes two newcomers with other settings that
// start at once safe: the later of the two lookups sees the other's row, so
// at least one of them withdraws (both may, and then retry).
func (s *Service) Start(ctx context.Context) error {
	// Which servers' tokens this replica's leases carry: read before it
	// announces itself, so a failure leaves no row behind.
	id, err := locking.IdentityOf(ctx, s.locker)
	if err != nil {
		return fmt.Errorf("identity of lock %q: %w", s.cfg.Lock, err)
	}
	s.lockID.Store(&id)
	// A restart under the same name starts afresh: an older started_at is
	// precedence it did not earn (see checkPeers).
	if err := s.store.RemoveReplica(ctx, s.cfg.Instance); err != nil {
		return fmt.Errorf("announce replica %q: %w", s.cfg.Instance, err)
	}
	if err := s.store.Heartbeat(ctx, s.replica()); err != nil {
		return fmt.Errorf("announce replica %q: %w", s.cfg.Instance, err)
	}
	if mixed, err := s.mixedPeers(ctx, false); err != nil || len(mixed) > 0 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyTimeout)
		defer cancel()
		if rerr := s.store.RemoveReplica(rctx, s.cfg.Instance); rerr != nil {
			s.log.Warn("withdrawing replica failed", "err", rerr)
		}
		if err != nil {
			return fmt.Errorf("announce replica %q: %w", s.cfg.Instance, err)
		}
		return fmt.Errorf("%w: %s", ErrMixedSettings, strings.Join(mixed, "; "))
	}
	// Alone with its settings now, it may take the fences over from
	// another backend's tokens, or other servers' of its own.
	epoch, reset, err := s.store.AdoptFences(ctx, s.cfg.Lock, id)
	if err != nil {
		return fmt.Errorf("adopt fences for lock %q: %w", s.cfg.Lock, err)
	}
	s.epoch.Store(epoch)
	if reset {
		s.log.Warn("the lock backend or its servers changed: fences moved to a new epoch", "lock", s.cfg.Lock, "lock_id", id, "epoch", epoch)
	}
	s.heartbeat.Go(s.sweepLoop)
	s.heartbeat.Go(func() {
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), heartbeatEvery)
			if err := s.store.Heartbeat(ctx, s.replica()); err != nil {
				s.log.Warn("replica heartbeat failed", "err", err)
			}
			s.refreshEpoch(ctx)
			cancel()
		}
	})
	return nil
}

// refreshEpoch takes the fences' epoch when they count in this replica's
// backend's tokens, on its servers: the fleet may have left the backend
// and come back to it (a new epoch) while this replica was frozen. Under
// another backend's epoch, or other servers', it keeps its own, which the
// fences refuse: 409 lock_lost, as a lost lease, while /readyz takes it
// out of the balancer (checkPeers). It never reads the identity again: a
// replica whose servers lost their data while it ran (a Redis restarted
// without persistence) stays on its epoch until it restarts
// (deploy/k8s/README.md, "Rolling updates").
func (s *Service) refreshEpoch(ctx context.Context) {
	lock, id, epoch, err := s.store.Fences(ctx)
	switch {
	case err != nil:
		s.log.Warn("fence epoch unread", "err", err)
	case s.ownsFences(lock, id) && epoch != s.epoch.Swap(epoch):
		s.log.Warn("the fences moved to a new epoch of this replica's backend", "lock", s.cfg.Lock, "epoch", epoch)
	}
}

// Close stops the heartbeat and removes this replica's row, so a restart
// with other settings is not held against it. Call it after the HTTP server
// has shut down; the Store, Cache and Locker are the caller's to close.
func (s *Service) Close() error {
	var err error
	s.stopOnce.Do(func() {
		close(s.stop)
		s.heartbeat.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = s.store.RemoveReplica(ctx, s.cfg.Instance)
	})
	return err
}

func (s *Service) replica() storage.Replica {
	return storage.Replica{Instance: s.cfg.Instance, Lock: s.cfg.Lock, Guard: string(s.cfg.Guard)}
}

// readyz: GET /readyz. 200 when MySQL and the lock backend answer and no
// live replica of the database that started earlier runs other settings,
// with "cache": "degraded" when Redis does not answer (orders then read
// MySQL); else 503 naming every failure. The answer names components and
// settings only: the errors themselves, with addresses and driver text, go
// to the log.
func (s *Service) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), readyTimeout)
	defer cancel()
	checks := []struct {
		name string // what the answer says when the check fails; "" = the error's own text
		run  func(context.Context) error
	}{
		{"mysql", s.store.Ping},
		{"lock " + s.cfg.Lock, s.probeLock},
		{"", s.checkPeers},
		{"cache", s.cache.Ping},
	}
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, check := range checks {
		wg.Go(func() { errs[i] = check.run(ctx) })
	}
	wg.Wait()
	cache := "ok"
	var failed []string
	for i, err := range errs {
		switch {
		case err == nil:
			continue
		case checks[i].name == "cache":
			cache = "degraded"
		case checks[i].name == "":
			failed = append(failed, err.Error())
		default:
			failed = append(failed, checks[i].name)
		}
		s.log.Warn("readiness check failed", "check", checks[i].name, "err", err)
	}
	if len(failed) > 0 {
		c.Response().Header().Set("Retry-After", retryAfterSecs)
		return c.JSON(http.StatusServiceUnavailable, map[string]apiError{"error": {
			Code: "unavailable", Message: "not ready: " + strings.Join(failed, "; "),
		}})
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ok", "cache": cache})
}

// probeLock takes and gives back a key of this replica's own: the lock
// backend is ready when it grants.
func (s *Service) probeLock(ctx context.Context) error {
	if s.locker == nil {
		return nil
	}
	lease, err := s.locker.Acquire(ctx, "readyz/"+s.cfg.Instance)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyTimeout)
	defer cancel()
	return lease.Release(rctx)
}

// checkPeers fails when a live replica with another lock or guard started
// before this one: only the newcomer of a mixed pair is unready, so the
// replicas serving stay in the balancer. Start refuses such a newcomer; this
// catches what Start could not see (a replica whose heartbeats had lapsed,
// paused or cut off from MySQL, that comes back). It also fails when the
// fences count in another backend's tokens, or other servers' of its
// own: the fleet moved there while this replica was away (or ran on), so
// its fenced writes are refused and it must restart with the fleet's lock.
func (s *Service) checkPeers(ctx context.Context) error {
	mixed, err := s.mixedPeers(ctx, true)
	if err != nil {
		s.log.Warn("replicas table unreadable", "err", err)
		return errors.New("replicas table")
	}
	if len(mixed) > 0 {
		return errors.New(strings.Join(mixed, "; "))
	}
	return nil
}

// mixedPeers describes the live replicas of this database that run another
// lock or guard; with olderOnly, only those that started before this one
// (by started_at, then instance name; a replica whose own row is missing is
// the newest). With olderOnly (/readyz), a replica whose lock, or lock
// servers (their identity), the fences no longer count in is superseded (its own checkPeers says so): it does
// not count against the fleet of the fences' backend, or one straggler that
// comes back would take that whole fleet out of the balancer. Start still
// counts it: the fences' backend may be the name a rival newcomer has not
// yet replaced (two newcomers at once must not both start), so a newcomer
// waits until the straggler is gone.
func (s *Service) mixedPeers(ctx context.Context, olderOnly bool) ([]string, error) {
	fences, fencesID, _, err := s.store.Fences(ctx)
	if err != nil {
		return nil, err
	}
	var mixed []string
	switch {
	case !olderOnly || fences == "" || s.ownsFences(fences, fencesID):
	case fences != s.cfg.Lock:
		mixed = append(mixed, fmt.Sprintf("the fences count in lock=%s tokens, this replica runs lock=%s: superseded, restart it with the fleet's lock",
			fences, s.cfg.Lock))
	default:
		mixed = append(mixed, fmt.Sprintf("the fences count in tokens of lock=%s servers %s, this replica's are %s: superseded, restart it",
			fences, fencesID, s.ownLockID()))
	}
	peers, err := s.store.LiveReplicas(ctx, liveWithin)
	if err != nil {
		return nil, err
	}
	self := -1
	for i, p := range peers {
		if p.Instance == s.cfg.Instance {
			self = i
		}
	}
	for i, p := range peers {
		if i == self || (p.Lock == s.cfg.Lock && p.Guard == string(s.cfg.Guard)) {
			continue
		}
		if olderOnly && s.ownsFences(fences, fencesID) && p.Lock != fences {
			continue // superseded
		}
		if olderOnly && self >= 0 && !older(p, peers[self]) {
			continue
		}
		mixed = append(mixed, fmt.Sprintf("live replica %s runs lock=%s guard=%s, this one lock=%s guard=%s",
			p.Instance, p.Lock, p.Guard, s.cfg.Lock, s.cfg.Guard))
	}
	return mixed, nil
}

// older reports whether a started before b.
func older(a, b storage.Replica) bool {
	if !a.StartedAt.Equal(b.StartedAt) {
		return a.StartedAt.Before(b.StartedAt)
	}
	return a.Instance < b.Instance
}

// ownLockID is the identity Start read ("" before Start).
func (s *Service) ownLockID() string {
	if id := s.lockID.Load(); id != nil {
		return *id
	}
	return ""
}

// ownsFences reports whether fences recorded for lock, on the servers
// with identity id, count in this replica's tokens.
func (s *Service) ownsFences(lock, id string) bool {
	return lock == s.cfg.Lock && id == s.ownLockID()
}
