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

// ErrMixedSettings: a live replica of the database runs another lock, the
// same lock on other servers, another guard, gate or accept. Behind one balancer they
// would not protect the same stock the same way (a bug seen in peer
// projects), and the fences follow one fleet's servers only.
var ErrMixedSettings = errors.New("replicas of one database run other settings")

// Start announces this replica in the replicas table, with its lock, its
// lock servers' identity and guard, and keeps heartbeating until Close. A
// replica that finds a live replica with other settings is the newcomer:
// Start withdraws it and returns ErrMixedSettings, and the replicas already
// serving go on. So a rolling update that changes the lock, its servers or
// the guard stalls with the old replicas serving, and one that keeps them
// completes (deploy/k8s/README.md, "Rolling updates"); an old replica that
// restarts while the new ones serve is refused, rather than taking the
// fences back to its servers. A dead replica's row stops counting
// liveWithin after its last heartbeat.
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
	if err := s.readiness.RemoveReplica(ctx, s.cfg.Instance); err != nil {
		return fmt.Errorf("announce replica %q: %w", s.cfg.Instance, err)
	}
	// From the announcement on, a failure takes the row back: left, it
	// would count as a live replica of these settings for liveWithin and
	// refuse newcomers with others.
	unannounce := func(err error) error {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyTimeout)
		defer cancel()
		if rerr := s.readiness.RemoveReplica(rctx, s.cfg.Instance); rerr != nil {
			s.log.Warn("withdrawing replica failed: its row lapses in 15 s", "err", rerr)
		}
		return err
	}
	if err := s.readiness.Heartbeat(ctx, s.replica()); err != nil {
		return unannounce(fmt.Errorf("announce replica %q: %w", s.cfg.Instance, err))
	}
	if mixed, err := s.mixedPeers(ctx, false); err != nil {
		return unannounce(fmt.Errorf("announce replica %q: %w", s.cfg.Instance, err))
	} else if len(mixed) > 0 {
		return unannounce(fmt.Errorf("%w: %s", ErrMixedSettings, strings.Join(mixed, "; ")))
	}
	// Alone with its settings now, it may take the fences over from
	// another backend's tokens, other servers' of its own, or another
	// guard's writes.
	epoch, reset, err := s.readiness.AdoptFences(ctx, s.fleet())
	if err != nil {
		return unannounce(fmt.Errorf("adopt fences for lock %q guard %q: %w", s.cfg.Lock, s.cfg.Guard, err))
	}
	s.epoch.Store(epoch)
	if reset {
		s.log.Warn("the lock backend, its servers or the guard changed: fences moved to a new epoch", "lock", s.cfg.Lock, "lock_id", id, "guard", s.cfg.Guard, "epoch", epoch)
	}
	if err := s.startIntake(ctx); err != nil {
		return unannounce(fmt.Errorf("%w: %w", ErrUnavailable, err))
	}
	s.heartbeat.Go(s.sweepLoop)
	s.heartbeat.Go(s.heartbeatLoop)
	return nil
}

// startIntake readies the gate and the queue, if configured. The key
// set's flag may predate a version that commits keyed orders without
// adding their keys (a rollback to it, now over): it is trusted again only
// once loaded from MySQL by this version. The keys stay, so takes in
// flight elsewhere keep theirs.
func (s *Service) startIntake(ctx context.Context) error {
	if s.cfg.Gate != nil {
		if err := s.cfg.Gate.ForgetKeys(ctx); err != nil {
			return fmt.Errorf("gate key set: %w", err)
		}
	}
	if s.cfg.Queue != nil {
		if err := s.cfg.Queue.Group(ctx); err != nil {
			return err
		}
		s.heartbeat.Go(s.consume)
	}
	return nil
}

// heartbeatLoop follows the fences and heartbeats every heartbeatEvery
// until Close; a failure withdraws the replica.
func (s *Service) heartbeatLoop() {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), heartbeatEvery)
		err := s.followFences(ctx)
		if err == nil {
			if err := s.readiness.Heartbeat(ctx, s.replica()); err != nil {
				s.log.Warn("replica heartbeat failed", "err", err)
			}
		}
		cancel()
		if err != nil {
			s.withdraw(err)
			return
		}
	}
}

// followFences reads which fleet the fences belong to, before each
// heartbeat. Its own fleet's epoch it takes: the fleet may have left these
// settings and come back to them (a new epoch) while this replica was
// frozen. Another fleet's at an epoch above its own means that fleet
// started after this replica's row had lapsed (frozen, or cut off from
// MySQL, past the liveness window) and adopted the fences: this replica is
// superseded, and followFences says why. Anything else (another fleet at
// an epoch not above its own, its own below it) is meta that lost this
// replica's adoption, in a failover or a restore: it adopts again
// (storage.Store.ReclaimFences), or no replica of its settings would be
// ready again, nor a straggler of the fleet meta names refused.
func (s *Service) followFences(ctx context.Context) error {
	fleet, epoch, err := s.readiness.Fences(ctx)
	if err != nil {
		s.log.Warn("fence epoch unread", "err", err)
		return nil
	}
	own := s.epoch.Load()
	switch {
	case fleet == s.fleet() && epoch >= own:
		if epoch > own {
			s.epoch.Store(epoch)
			s.log.Warn("the fences moved to a new epoch of this replica's settings", "lock", s.cfg.Lock, "guard", s.cfg.Guard, "epoch", epoch)
		}
		return nil
	case fleet != s.fleet() && epoch > own:
		return s.supersededBy(fleet, epoch)
	}
	epoch, superseded, err := s.readiness.ReclaimFences(ctx, s.fleet(), own)
	switch {
	case err != nil:
		s.log.Warn("adopting the fences again failed", "err", err)
	case superseded: // another fleet adopted them since the read
		if fleet, epoch, err = s.readiness.Fences(ctx); err == nil {
			return s.supersededBy(fleet, epoch)
		}
		s.log.Warn("fence epoch unread", "err", err)
	default:
		s.epoch.Store(epoch)
		s.log.Warn("the fences had lost this replica's adoption (a failover or a restore): adopted again",
			"lock", s.cfg.Lock, "guard", s.cfg.Guard, "epoch", epoch, "was_lock", fleet.Lock, "was_guard", fleet.Guard)
	}
	return nil
}

// supersededBy says why this replica withdraws: ErrMixedSettings, as a
// refused newcomer's, naming the fleet the fences belong to.
func (s *Service) supersededBy(fleet storage.Fleet, epoch uint64) error {
	return fmt.Errorf("%w: %s", ErrMixedSettings, s.whySuperseded(fleet, epoch))
}

func (s *Service) whySuperseded(fleet storage.Fleet, epoch uint64) string {
	why := fmt.Sprintf("superseded: the fences belong to lock=%s guard=%s (epoch %d), this replica runs lock=%s guard=%s (epoch %d)",
		fleet.Lock, fleet.Guard, epoch, s.cfg.Lock, s.cfg.Guard, s.epoch.Load())
	if fleet.Lock == s.cfg.Lock && fleet.LockID != s.ownLockID() {
		why += fmt.Sprintf(" on other lock servers (the fences' %s, its own %s)", fleet.LockID, s.ownLockID())
	}
	return why + ": restart it with the fleet's settings"
}

// withdraw takes a superseded replica out of the replicas table for good:
// its heartbeat and sweeper stop, so replicas of the current fleet start
// again (a newcomer's Start counts every live row), and its /readyz stays
// 503 naming why. It goes on answering, unready: it does not exit, since
// its restart with the same settings would be refused as a newcomer while
// the fleet that superseded it runs (another lock, lock servers or guard),
// a restart loop. Every write it is sent answers 409 lock_lost
// (refuseIfWithdrawn); an operator restarts it with the fleet's settings.
func (s *Service) withdraw(why error) {
	s.log.Error("withdrawing this replica", "err", why)
	s.whyWithdrawn = why // before the close, which publishes it
	close(s.withdrawn)
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := s.readiness.RemoveReplica(ctx, s.cfg.Instance); err != nil {
		s.log.Warn("withdrawing replica failed: its row lapses in 15 s", "err", err)
	}
}

// refuseIfWithdrawn refuses every write of a replica that withdrew:
// the balancer sends it nothing, but a client may
// address it directly, and MySQL refuses its stale writes only under the
// fencing guard. 409 lock_lost, as its fenced writes get: nothing was
// written, the client retries on another replica.
func (s *Service) refuseIfWithdrawn() error {
	select {
	case <-s.withdrawn:
		return fmt.Errorf("%w: this replica was superseded and withdrew", ErrLockLost)
	default:
		return nil
	}
}

// beforeWrite is the check right before a write: nothing is written once
// the lease is known lost, nor by a replica that withdrew while the
// request waited for its lock or read (a check at the request's start
// alone would let those write).
func (s *Service) beforeWrite(leaseLost bool, what string) error {
	if err := s.refuseIfWithdrawn(); err != nil {
		return err
	}
	if leaseLost {
		return fmt.Errorf("%w before the %s", ErrLockLost, what)
	}
	return nil
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
		err = s.readiness.RemoveReplica(ctx, s.cfg.Instance)
	})
	return err
}

func (s *Service) replica() storage.Replica {
	return storage.Replica{Instance: s.cfg.Instance, Lock: s.cfg.Lock, LockID: s.ownLockID(), Guard: string(s.cfg.Guard),
		Gate: s.gateName(), Accept: s.acceptName()}
}

// gateName and acceptName are OVERSOLD_GATE's and OVERSOLD_ACCEPT's
// values, as the replicas table records them. A gate that records the
// Idempotency-Keys it takes for is "redis+keys": an older version's gated
// replica ("redis") commits keyed orders the key set never learns of, and
// the set would answer their replays out of stock.
func (s *Service) gateName() string {
	if s.cfg.Gate == nil {
		return "none"
	}
	return "redis+keys"
}

// gateOf and acceptOf are a row's gate and accept: "" is a version
// older than them, which takes from no gate (as "none") and answers after
// MySQL (as "sync").
func gateOf(p storage.Replica) string {
	if p.Gate == "" {
		return "none"
	}
	return p.Gate
}

func acceptOf(p storage.Replica) string {
	if p.Accept == "" {
		return "sync"
	}
	return p.Accept
}

func (s *Service) acceptName() string {
	if s.cfg.Queue == nil {
		return "sync"
	}
	return "queue"
}

// fleet is this replica's settings, as the fences record them.
func (s *Service) fleet() storage.Fleet {
	return storage.Fleet{Lock: s.cfg.Lock, LockID: s.ownLockID(), Guard: string(s.cfg.Guard)}
}

// ownLockID is the identity Start read ("" before Start).
func (s *Service) ownLockID() string {
	if id := s.lockID.Load(); id != nil {
		return *id
	}
	return ""
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
		{"mysql", s.readiness.Ping},
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

// checkPeers fails when a live replica with other settings started
// before this one: only the newcomer of a mixed pair is unready, so the
// replicas serving stay in the balancer. Start refuses such a newcomer; this
// catches what Start could not see (a replica whose heartbeats had lapsed,
// paused or cut off from MySQL, that comes back). It also fails when this
// replica is superseded: another fleet adopted the fences at a later epoch
// while it was away, so its fenced writes are refused, and its heartbeat
// withdraws it.
func (s *Service) checkPeers(ctx context.Context) error {
	select {
	case <-s.withdrawn: // for good, even once the fences name its settings again
		return s.whyWithdrawn
	default:
	}
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
// lock, the same lock on other servers (another identity; "" is a row of
// an older version, or a lock without one: not mixed) or another guard;
// with olderOnly, only those that started before this one
// (by started_at, then instance name; a replica whose own row is missing is
// the newest). With olderOnly (/readyz), a replica of the fleet the fences
// belong to counts no other: one with other settings is a straggler the
// fences superseded (its own checkPeers says so, and its next heartbeat
// withdraws it), which would otherwise take the whole fleet out of the
// balancer. Start still counts it: the fences may name settings a rival
// newcomer is about to replace (two newcomers at once must not both
// start), so a newcomer waits until the straggler has withdrawn.
func (s *Service) mixedPeers(ctx context.Context, olderOnly bool) ([]string, error) {
	fleet, epoch, err := s.readiness.Fences(ctx)
	if err != nil {
		return nil, err
	}
	var mixed []string
	if olderOnly && fleet != s.fleet() && epoch > s.epoch.Load() {
		mixed = append(mixed, s.whySuperseded(fleet, epoch))
	}
	peers, err := s.readiness.LiveReplicas(ctx, liveWithin)
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
		otherServers := p.LockID != "" && p.LockID != s.ownLockID()
		// A gated replica and an ungated one would not take from one
		// counter, nor record keys in one set; a queue replica answers
		// before MySQL while a sync one writes past the queue.
		otherIntake := gateOf(p) != s.gateName() || acceptOf(p) != s.acceptName()
		if i == self || (p.Lock == s.cfg.Lock && p.Guard == string(s.cfg.Guard) && !otherServers && !otherIntake) {
			continue
		}
		if olderOnly && fleet == s.fleet() {
			continue // superseded
		}
		if olderOnly && self >= 0 && !older(p, peers[self]) {
			continue
		}
		theirs, ours := fmt.Sprintf("lock=%s guard=%s", p.Lock, p.Guard), fmt.Sprintf("lock=%s guard=%s", s.cfg.Lock, s.cfg.Guard)
		if otherIntake {
			theirs += fmt.Sprintf(" gate=%s accept=%s", gateOf(p), acceptOf(p))
			ours += fmt.Sprintf(" gate=%s accept=%s", s.gateName(), s.acceptName())
		}
		why := fmt.Sprintf("live replica %s runs %s, this one %s", p.Instance, theirs, ours)
		if p.Lock == s.cfg.Lock && otherServers {
			why += fmt.Sprintf(", on other lock servers (its %s, this one's %s)", p.LockID, s.ownLockID())
		}
		mixed = append(mixed, why)
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
