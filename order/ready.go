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

// readyz: GET /readyz. 200 when MySQL, Redis and the lock backend answer and
// no live replica of the database runs other settings; else 503 naming
// every failure.
func (s *Service) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), readyTimeout)
	defer cancel()
	checks := []func(context.Context) error{
		func(ctx context.Context) error { return prefix("mysql", s.store.Ping(ctx)) },
		func(ctx context.Context) error { return prefix("redis", s.cache.Ping(ctx)) },
		s.probeLock,
		s.checkPeers,
	}
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, check := range checks {
		wg.Go(func() { errs[i] = check(ctx) })
	}
	wg.Wait()
	var failed []string
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err.Error())
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%w: not ready: %s", ErrUnavailable, strings.Join(failed, "; "))
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// probeLock takes and gives back a key of this replica's own: the lock
// backend is ready when it grants.
func (s *Service) probeLock(ctx context.Context) error {
	if s.locker == nil {
		return nil
	}
	lease, err := s.locker.Acquire(ctx, "readyz/"+s.cfg.Instance)
	if err != nil {
		return prefix("lock "+s.cfg.Lock, err)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyTimeout)
	defer cancel()
	return prefix("lock "+s.cfg.Lock, lease.Release(rctx))
}

// checkPeers names every live replica of this database running another lock
// or guard.
func (s *Service) checkPeers(ctx context.Context) error {
	peers, err := s.store.LiveReplicas(ctx, liveWithin)
	if err != nil {
		return prefix("replicas", err)
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

func prefix(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}
