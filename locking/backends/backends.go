// Package backends opens any lock backend by name, so orderd, the lab, the
// tests and outside tools build lockers the same way. It is the only place
// that knows every backend.
package backends

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/etcdlock"
	"github.com/oversold-lab/oversold/locking/etcdlock/lostrevoke"
	"github.com/oversold-lab/oversold/locking/etcdlock/namereuse"
	"github.com/oversold-lab/oversold/locking/etcdlock/quickwake"
	"github.com/oversold-lab/oversold/locking/keepalive"
	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/locking/mysqllock"
	"github.com/oversold-lab/oversold/locking/mysqllock/memtable"
	"github.com/oversold-lab/oversold/locking/mysqllock/namedqueue"
	"github.com/oversold-lab/oversold/locking/mysqllock/serverguard"
	"github.com/oversold-lab/oversold/locking/redislock"
	"github.com/oversold-lab/oversold/locking/redislock/fairqueue"
	"github.com/oversold-lab/oversold/locking/redislock/reclaim"
	"github.com/oversold-lab/oversold/locking/redlock"
	"github.com/oversold-lab/oversold/locking/redlock/fairwake"
	"github.com/oversold-lab/oversold/locking/redlock/quorum"
	"github.com/oversold-lab/oversold/locking/zklock"
	"github.com/oversold-lab/oversold/locking/zklock/ensembleid"
	"github.com/oversold-lab/oversold/locking/zklock/handover"
	"github.com/oversold-lab/oversold/locking/zklock/protected"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	_ "github.com/go-sql-driver/mysql" // the "mysql" driver the mysql lock opens
)

// Names lists the backends Open knows, in the order the lab runs them.
var Names = []string{"local", "redis", "redlock", "zookeeper", "mysql", "etcd"}

// Config carries every backend's settings; each backend reads its own.
type Config struct {
	TTL           time.Duration // lease time to live; 0 = 10s
	RedisAddr     string
	RedlockAddrs  []string
	ZKServers     []string
	EtcdEndpoints []string
	MySQLDSN      string
	// FallbackWait, if set, replaces the jittered fallback timer of a queued
	// waiter on redis and redlock (which a release message cuts short).
	// Tests set a long one to prove that wake-ups alone keep a queue moving.
	FallbackWait time.Duration
	// RedlockNodeTimeout, if set, replaces redlock's bound on one request
	// to one node (TTL/20, at most 100 ms). Tests on a loaded machine set
	// a longer one, so that three healthy nodes slower than 50 ms do not
	// make Acquire give up with ErrUnavailable.
	RedlockNodeTimeout time.Duration

	// OnRenewalFailed, if set, hears every failed lease renewal (metrics).
	OnRenewalFailed func(key string, err error) `json:"-"`
}

// DefaultTTL is the lease time to live when Config.TTL is zero.
const DefaultTTL = 10 * time.Second

func (c Config) ttl() time.Duration {
	if c.TTL <= 0 {
		return DefaultTTL
	}
	return c.TTL
}

// Open returns the named backend ("local", "redis", "redlock", "zookeeper",
// "mysql", "etcd"), connected and checked: a server that does not answer is
// an error wrapping locking.ErrUnavailable. The returned Locker's Close also
// closes the clients Open made.
func Open(ctx context.Context, name string, cfg Config) (locking.Locker, error) {
	switch name {
	case "local":
		return local.New(), nil
	case "redis":
		return openRedis(ctx, cfg)
	case "redlock":
		return openRedlock(ctx, cfg)
	case "mysql":
		return openMySQL(ctx, cfg)
	case "zookeeper":
		return openZooKeeper(ctx, cfg)
	case "etcd":
		return openEtcd(ctx, cfg)
	default:
		return nil, fmt.Errorf("unknown lock backend %q (want one of %v)", name, Names)
	}
}

// openRedis opens the Redis lock on one server, refusing one that may evict its keys.
func openRedis(ctx context.Context, cfg Config) (locking.Locker, error) {
	client, err := redisconn.Open(cfg.RedisAddr)
	if err != nil {
		return nil, fmt.Errorf("redis lock: %w", err)
	}
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return nil, unavailable("redis", err)
	}
	if err := redislock.CheckEviction(ctx, client); err != nil {
		client.Close()
		return nil, fmt.Errorf("redis lock: %w", err)
	}
	// The recipe with its hardening: a fair queue with direct handoff, and
	// the re-release of a key a failover kept.
	l := redislock.New(client, redislock.Config{TTL: cfg.ttl(), OnRenewalFailed: cfg.OnRenewalFailed,
		MinBackoff: cfg.FallbackWait, MaxBackoff: cfg.FallbackWait, Queue: reclaim.Wrap(fairqueue.New)})
	return owned{Locker: l, closers: []func() error{client.Close}}, nil
}

// openRedlock opens the Redlock lock on its nodes: a majority must answer.
func openRedlock(ctx context.Context, cfg Config) (locking.Locker, error) {
	var (
		clients []redis.UniversalClient
		closers []func() error
	)
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	for _, addr := range cfg.RedlockAddrs {
		c, err := redisconn.Open(addr)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("redlock lock: %w", err)
		}
		clients, closers = append(clients, c), append(closers, c.Close)
	}
	l, err := NewRedlock(clients, redlock.Config{TTL: cfg.ttl(), NodeTimeout: cfg.RedlockNodeTimeout, OnRenewalFailed: cfg.OnRenewalFailed,
		MinBackoff: cfg.FallbackWait, MaxBackoff: cfg.FallbackWait})
	if err != nil {
		closeAll()
		return nil, err
	}
	if err := l.Ping(ctx); err != nil { // a majority must answer
		closeAll()
		return nil, unavailable("redlock", err)
	}
	// An evicting node is a vote that can vanish: check every node up
	// (a minority may be down at start; a majority answered Ping).
	for _, c := range clients {
		if c.Ping(ctx).Err() != nil {
			continue
		}
		if err := redislock.CheckEviction(ctx, c); err != nil {
			closeAll()
			return nil, fmt.Errorf("redlock lock: %w", err)
		}
	}
	return owned{Locker: l, closers: closers}, nil
}

// NewRedlock is the Redlock recipe as orderd runs it: it returns as soon as
// a majority's answers settle a request (quorum), and its waiters queue on
// every node and are woken by the release (fairwake).
func NewRedlock(clients []redis.UniversalClient, cfg redlock.Config) (*redlock.Locker, error) {
	cfg.Fanout, cfg.Queue = quorum.New(len(clients)), fairwake.New(clients)
	return redlock.New(clients, cfg)
}

// openMySQL opens the MySQL lock on a pool of its own.
func openMySQL(ctx context.Context, cfg Config) (locking.Locker, error) {
	// Its own pool: sized for the lock, its statements kept out of
	// the binary log, the topology checked.
	db, err := serverguard.OpenDB(ctx, cfg.MySQLDSN)
	if err != nil {
		return nil, fmt.Errorf("mysql lock: %w", err)
	}
	l := NewMySQL(db, mysqllock.Config{TTL: cfg.ttl(), OnRenewalFailed: cfg.OnRenewalFailed})
	return owned{Locker: l, closers: []func() error{db.Close}}, nil
}

// NewMySQL composes the mysql lock on db (a pool from serverguard.OpenDB)
// as Open does: the recipe, its leases in memtable's MEMORY table, its
// waiters woken by namedqueue. cfg's Table and Line are replaced.
func NewMySQL(db *sql.DB, cfg mysqllock.Config) *mysqllock.Locker {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	table := memtable.New(db, cfg.TTL)
	cfg.Table, cfg.Line = table, namedqueue.New(table, cfg.MinPoll, cfg.MaxPoll)
	return mysqllock.New(db, cfg)
}

// openZooKeeper opens the ZooKeeper lock: the recipe, with the create that
// survives a lost reply, the shared watchdog, callers that stop waiting at
// once, and the ensemble's identity.
func openZooKeeper(ctx context.Context, cfg Config) (locking.Locker, error) {
	// The Locker dials ZooKeeper itself: the session is the lease.
	l, err := zklock.New(ctx, cfg.ZKServers, zklock.Config{SessionTimeout: cfg.ttl(),
		Create: protected.Create, Watchdog: zkWatchdog(cfg.OnRenewalFailed)})
	if err != nil {
		return nil, unavailable("zookeeper", err)
	}
	return ensembleid.With(handover.New(l), l), nil
}

// zkWatchdog is a zklock.WatchdogFunc on the shared keepalive.Watchdog
// (one runtime timer for every lease), whose failed checks onFail hears.
func zkWatchdog(onFail func(key string, err error)) zklock.WatchdogFunc {
	return func(key string, ttl time.Duration, sent time.Time, check func(context.Context) error) zklock.Watchdog {
		var fail func(error)
		if onFail != nil {
			fail = func(err error) { onFail(key, err) }
		}
		return keepalive.Start(ttl, sent, check, fail)
	}
}

// openEtcd opens the etcd lock: the recipe, with its session renewed on the
// shared watchdog, a hot key's names reused, waiters woken without etcd's
// catch-up of past watches, and lost sessions revoked at once.
func openEtcd(ctx context.Context, cfg Config) (locking.Locker, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.EtcdEndpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, unavailable("etcd", err)
	}
	revoker := lostrevoke.New(cli)
	// New grants the session lease: that is the check that etcd answers.
	l, err := etcdlock.New(ctx, cli, etcdlock.Config{TTL: cfg.ttl(), Renew: etcdRenewal(cfg.OnRenewalFailed),
		Names: namereuse.New, Wait: quickwake.Waiter{}, OnLost: revoker.Lost})
	if err != nil {
		revoker.Close()
		cli.Close()
		return nil, unavailable("etcd", err)
	}
	stream := quickwake.KeepStream(cli, etcdlock.DefaultPrefix)
	return owned{Locker: l, closers: []func() error{stream, revoker.Close, cli.Close}}, nil
}

// etcdRenewal renews etcd's session leases on the shared watchdog: its
// alarms share one runtime timer, and onFail hears every failed renewal.
func etcdRenewal(onFail func(key string, err error)) func(time.Duration, time.Time, etcdlock.RenewFunc) etcdlock.Renewal {
	return func(ttl time.Duration, sent time.Time, renew etcdlock.RenewFunc) etcdlock.Renewal {
		var failed func(error)
		if onFail != nil {
			failed = func(err error) { onFail("", err) } // one renewal serves every key
		}
		return keepalive.Start(ttl, sent, keepalive.RenewFunc(renew), failed)
	}
}

// owned closes the clients Open made after the Locker built on them.
type owned struct {
	locking.Locker
	closers []func() error
}

// Identity is the Locker's own (locking.IdentityOf): the embedding alone
// would hide it.
func (o owned) Identity(ctx context.Context) (string, error) {
	return locking.IdentityOf(ctx, o.Locker)
}

func (o owned) Close() error {
	errs := []error{o.Locker.Close()}
	for _, c := range o.closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

// unavailable wraps a connection failure so callers can tell it apart.
func unavailable(name string, err error) error {
	return fmt.Errorf("%s lock: %w: %w", name, locking.ErrUnavailable, err)
}
