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

// Start announces this replica in the replicas table, with its lock and
// guard, and keeps heartbeating until Close. Replicas of one database that
// run different settings make each other unready: behind one balancer they
// would not protect the same stock the same way (a bug seen in peer
// projects).
func (s *Service) Start(ctx context.Context) error {
	if err := s.store.Heartbeat(ctx, s.replica()); err != nil {
		return fmt.Errorf("announce replica %q: %w", s.cfg.Instance, err)
	}
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
			cancel()
		}
	})
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
		err = s.store.RemoveReplica(ctx, s.cfg.Instance)
	})
	return err
}

func (s *Service) replica() storage.Replica {
	return storage.Replica{Instance: s.cfg.Instance, Lock: s.cfg.Lock, Guard: string(s.cfg.Guard)}
}

// readyz: GET /readyz. 200 when MySQL and the lock backend answer and no
// live replica of the database runs other settings, with "cache":
// "degraded" when Redis does not answer (orders then read MySQL); else 503
// naming every failure. The answer names components and settings only:
// the errors themselves, with addresses and driver text, go to the log.
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

// checkPeers names every live replica of this database running another lock
// or guard.
func (s *Service) checkPeers(ctx context.Context) error {
	peers, err := s.store.LiveReplicas(ctx, liveWithin)
	if err != nil {
		s.log.Warn("replicas table unreadable", "err", err)
		return errors.New("replicas table")
	}
	var mixed []string
	for _, p := range peers {
		if p.Instance != s.cfg.Instance && (p.Lock != s.cfg.Lock || p.Guard != string(s.cfg.Guard)) {
			mixed = append(mixed, fmt.Sprintf("replica %s runs lock=%s guard=%s, this one lock=%s guard=%s",
				p.Instance, p.Lock, p.Guard, s.cfg.Lock, s.cfg.Guard))
		}
	}
	if len(mixed) > 0 {
		return errors.New(strings.Join(mixed, "; "))
	}
	return nil
}
