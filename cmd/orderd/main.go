// Command orderd is one replica of the oversold order service: the flow of
// package order behind its HTTP API, on MySQL, a Redis stock cache and the
// lock backend named by OVERSOLD_LOCK.
//
// Settings come from the environment and from flags of the same name
// (OVERSOLD_LOCK_TTL is --lock-ttl; a flag wins); see orderd --help or
// docs/design.md. A bad setting, or a server that does not answer at start, stops
// orderd with one line naming the variable and exit status 2. SIGINT or
// SIGTERM stops accepting connections and lets in-flight orders finish.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/redislock"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

const (
	// startTimeout bounds connecting to every server and migrating (which
	// may wait up to 30s for another replica's migration).
	startTimeout = 45 * time.Second
)

// lockVar names the variable that points a lock backend at its servers,
// so that an unreachable lock server is reported against it.
var lockVar = map[string]string{
	"local":     "OVERSOLD_LOCK",
	"redis":     "OVERSOLD_REDIS_ADDR",
	"redlock":   "OVERSOLD_REDLOCK_ADDRS",
	"zookeeper": "OVERSOLD_ZK_SERVERS",
	"mysql":     "OVERSOLD_MYSQL_DSN",
	"etcd":      "OVERSOLD_ETCD_ENDPOINTS",
}

func main() {
	// go-redis prints pool chatter ("failed to dial after 5 attempts") to
	// stderr on its own; its errors reach us as return values anyway, and a
	// bad setting must stay one line.
	redis.SetLogger(quietRedis{})
	// Libraries that log through slog's default (the zookeeper lock) log
	// JSON to stderr like orderd itself.
	slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, nil)))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "orderd:", strings.ReplaceAll(err.Error(), "\n", "; "))
		os.Exit(exitCode(err))
	}
}

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// exitCode is 2 for a bad setting (unreachable servers at start included),
// 1 for any other failure.
func exitCode(err error) int {
	var ce *configError
	if errors.As(err, &ce) {
		return 2
	}
	return 1
}

// run starts the replica and serves until ctx is done, then shuts down:
// the listener first, then in-flight orders finish, then the heartbeat,
// the locker, Redis and MySQL close, in that order.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		usage(stderr)
		return nil
	}
	if err != nil {
		return err
	}
	base := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: logLevel}))
	log := base.With("instance", cfg.Instance)

	start, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	store, err := storage.Open(start, cfg.MySQLDSN)
	if err != nil {
		return &configError{Var: "OVERSOLD_MYSQL_DSN", Err: err}
	}
	defer store.Close()
	store.SetMaxConns(cfg.MySQLMaxConns)

	rdb, err := redisconn.Open(cfg.RedisAddr)
	if err != nil {
		return &configError{Var: "OVERSOLD_REDIS_ADDR", Err: err}
	}
	defer rdb.Close()
	if err := rdb.Ping(start).Err(); err != nil {
		return &configError{Var: "OVERSOLD_REDIS_ADDR", Err: fmt.Errorf("ping %s: %w", cfg.RedisAddr, err)}
	}
	if cfg.Gate == "redis" {
		// An evicted counter would be seeded again without what is in
		// flight, an evicted key set would answer a replay out_of_stock.
		if err := redislock.CheckEviction(start, rdb); err != nil {
			return &configError{Var: "OVERSOLD_REDIS_ADDR", Err: fmt.Errorf("stock gate: %w", err)}
		}
	}

	metrics := order.NewMetrics(cfg.Instance, cfg.Lock, cfg.Guard)
	var locker locking.Locker // nil for lock=none
	if cfg.Lock != "none" {
		locker, err = backends.Open(start, cfg.Lock, backends.Config{
			TTL:             cfg.LockTTL,
			RedisAddr:       cfg.RedisAddr,
			RedlockAddrs:    cfg.RedlockAddrs,
			ZKServers:       cfg.ZKServers,
			EtcdEndpoints:   cfg.EtcdEndpoints,
			MySQLDSN:        cfg.MySQLDSN,
			OnRenewalFailed: metrics.RenewalFailed,
		})
		if err != nil {
			return &configError{Var: lockVar[cfg.Lock], Err: err}
		}
		defer locker.Close()
	}

	// The cache's keys carry the database's identity: a recreated database,
	// or another deployment's on the same Redis, never meets these entries.
	cache := inventory.New(rdb, "oversold:", store.DatabaseIdentity())
	var gate order.StockGate   // nil for gate=none
	var queue order.OrderQueue // nil for accept=sync
	if cfg.Gate == "redis" {
		g := inventory.NewGate(rdb, "oversold:", store.DatabaseIdentity())
		gate = g
		if cfg.Accept == "queue" {
			queue = g.Queue()
		}
	}
	svc := order.New(store, cache, locker, order.Config{
		Gate:           gate,
		Queue:          queue,
		Instance:       cfg.Instance,
		Lock:           cfg.Lock,
		Guard:          cfg.Guard,
		LockWait:       cfg.LockWait,
		WorkDelay:      cfg.WorkDelay,
		BatchMax:       cfg.BatchMax,
		BatchWait:      cfg.BatchWait,
		ReservationTTL: cfg.ReservationTTL,
		SweepInterval:  cfg.SweepInterval,
		AdminToken:     cfg.AdminToken,
		MaxInFlight:    cfg.MaxInFlight,
		RequestTimeout: cfg.RequestTimeout,
		Logger:         base,
		Metrics:        metrics,
		Observers:      faultHook(cfg.FaultHook, cfg.Instance, log),
	})
	if err := svc.Start(start); err != nil {
		if errors.Is(err, order.ErrMixedSettings) {
			// The newcomer of a rollout that changes these: the replicas
			// already serving go on (deploy/k8s/README.md, "Rolling updates").
			return &configError{Var: "OVERSOLD_LOCK, OVERSOLD_GUARD, OVERSOLD_GATE, OVERSOLD_ACCEPT", Err: err}
		}
		if errors.Is(err, locking.ErrUnavailable) { // the lock servers' identity unread
			return &configError{Var: lockVar[cfg.Lock], Err: err}
		}
		return err
	}
	defer svc.Close()

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return &configError{Var: "OVERSOLD_ADDR", Err: err}
	}
	srv := &http.Server{
		Handler: svc.Handler(),
		// A client has the request timeout, at most 20 s, to send its
		// whole request, headers and body: a client that drips or stalls
		// its bytes cannot hold a connection past it. It holds no
		// in-flight slot meanwhile: a request takes one once its body is
		// read (order/limit.go).
		ReadTimeout: svc.ReadTimeout(),
		// The answer's bound: the request's time, and the bounded time
		// past it of the batch that took the order, which grows with
		// OVERSOLD_BATCH_MAX·OVERSOLD_WORK_DELAY (an order's outcome never
		// depends on the client's connection, and its answer must reach it).
		WriteTimeout: svc.WriteTimeout(),
		IdleTimeout:  2 * time.Minute,
		ErrorLog:     slog.NewLogLogger(base.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("orderd listening", "addr", ln.Addr().String(), "lock", cfg.Lock, "guard", cfg.Guard,
		"mysql", storage.MaskDSN(cfg.MySQLDSN), "redis", cfg.RedisAddr,
		"lock_wait", cfg.LockWait.String(), "work_delay", cfg.WorkDelay.String(), "batch_max", cfg.BatchMax, "batch_wait", cfg.BatchWait.String(), "admin", cfg.AdminToken != "")

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// An order admitted just before the signal may take as long as its
	// answer's bound: cutting it sooner could drop an answer whose commit
	// landed.
	shutdownTimeout := svc.WriteTimeout()
	log.Info("shutting down: finishing in-flight orders", "timeout", shutdownTimeout.String())
	sctx, cancelShutdown := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancelShutdown()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}
