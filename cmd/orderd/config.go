package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// config is orderd's settings: docs/design.md's configuration table.
type config struct {
	Addr           string
	Instance       string
	MySQLDSN       string
	Database       string // from MySQLDSN: the cache's key prefix
	RedisAddr      string
	RedlockAddrs   []string
	ZKServers      []string
	EtcdEndpoints  []string
	Lock           string // "none" or one of backends.Names
	Guard          storage.Guard
	Gate           string // none or redis
	Accept         string // sync or queue
	LockTTL        time.Duration
	LockWait       time.Duration
	WorkDelay      time.Duration
	BatchMax       int
	BatchWait      time.Duration
	ReservationTTL time.Duration
	SweepInterval  time.Duration
	AdminToken     string
	MaxInFlight    int
	RequestTimeout time.Duration
	MySQLMaxConns  int
	FaultHook      string // lab builds only: see faulthook_lab.go
}

// setting is one row of the table: a variable, its default, and how it
// lands in config. Its flag is the variable's name in kebab case.
type setting struct {
	env, def, usage string
	set             func(c *config, v string) error
}

var settings = []setting{
	{"OVERSOLD_ADDR", ":8080", "listen address", func(c *config, v string) error {
		c.Addr = v
		return checkHostPort(v)
	}},
	{"OVERSOLD_INSTANCE", "", "replica name in logs, metrics and orders (default: the hostname)", func(c *config, v string) error {
		if v == "" {
			h, err := os.Hostname()
			if err != nil {
				return fmt.Errorf("no value and no hostname: %w", err)
			}
			v = h
		}
		c.Instance = v
		if len(v) > 255 {
			return errors.New("longer than 255 bytes")
		}
		return nil
	}},
	{"OVERSOLD_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/oversold?parseTime=true", "go-sql-driver DSN", func(c *config, v string) error {
		cfg, err := mysql.ParseDSN(v)
		if err != nil {
			return err
		}
		if cfg.DBName == "" {
			return errors.New("names no database")
		}
		c.MySQLDSN, c.Database = v, cfg.DBName
		return nil
	}},
	{"OVERSOLD_REDIS_ADDR", "127.0.0.1:6379", "Redis for the stock cache and the redis lock", func(c *config, v string) error {
		c.RedisAddr = v
		_, err := redisconn.Options(v)
		return err
	}},
	{"OVERSOLD_REDLOCK_ADDRS", "", "comma-separated independent Redis masters", func(c *config, v string) (err error) {
		c.RedlockAddrs, err = hostPorts(v)
		return err
	}},
	{"OVERSOLD_ZK_SERVERS", "127.0.0.1:2181", "comma-separated ZooKeeper servers", func(c *config, v string) (err error) {
		c.ZKServers, err = hostPorts(v)
		return err
	}},
	{"OVERSOLD_ETCD_ENDPOINTS", "127.0.0.1:2379", "comma-separated etcd endpoints", func(c *config, v string) (err error) {
		c.EtcdEndpoints, err = hostPorts(v)
		return err
	}},
	{"OVERSOLD_LOCK", "redis", "none, " + strings.Join(backends.Names, ", "), func(c *config, v string) error {
		c.Lock = v
		if v != "none" && !slices.Contains(backends.Names, v) {
			return fmt.Errorf("unknown lock %q (want none, %s)", v, strings.Join(backends.Names, ", "))
		}
		return nil
	}},
	{"OVERSOLD_GUARD", "version", "none, version, fencing, atomic", func(c *config, v string) (err error) {
		c.Guard, err = storage.ParseGuard(v)
		return err
	}},
	{"OVERSOLD_GATE", "none", "none, redis: the stock gate", func(c *config, v string) error {
		c.Gate = v
		if v != "none" && v != "redis" {
			return fmt.Errorf("unknown gate %q (want none, redis)", v)
		}
		return nil
	}},
	{"OVERSOLD_ACCEPT", "sync", "sync, queue: when an order is answered (queue needs OVERSOLD_GATE=redis)", func(c *config, v string) error {
		c.Accept = v
		if v != "sync" && v != "queue" {
			return fmt.Errorf("unknown accept %q (want sync, queue)", v)
		}
		return nil
	}},
	{"OVERSOLD_LOCK_TTL", "10s", "lease time to live", func(c *config, v string) (err error) {
		c.LockTTL, err = duration(v, false)
		return err
	}},
	{"OVERSOLD_LOCK_WAIT", "5s", "longest wait for a lock before 503", func(c *config, v string) (err error) {
		c.LockWait, err = duration(v, false)
		return err
	}},
	{"OVERSOLD_WORK_DELAY", "0", "simulated work inside the critical section", func(c *config, v string) (err error) {
		c.WorkDelay, err = duration(v, true)
		return err
	}},
	{"OVERSOLD_BATCH_MAX", "64", "most orders of one SKU sold under one lock grant, in one transaction (1: no coalescing)", func(c *config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return fmt.Errorf("%q is not a whole number from 1 to 1000", v)
		}
		c.BatchMax = n
		return nil
	}},
	{"OVERSOLD_BATCH_WAIT", "0", "how long a granted lock waits for more orders to join its batch", func(c *config, v string) (err error) {
		c.BatchWait, err = duration(v, true)
		return err
	}},
	{"OVERSOLD_RESERVATION_TTL", "10m", "a reservation's hold time when the request names none", func(c *config, v string) (err error) {
		c.ReservationTTL, err = duration(v, false)
		if err == nil && c.ReservationTTL < time.Second {
			err = fmt.Errorf("%q is under 1s", v)
		}
		return err
	}},
	{"OVERSOLD_SWEEP_INTERVAL", "1s", "how often a replica looks for expired reservations", func(c *config, v string) (err error) {
		c.SweepInterval, err = duration(v, false)
		return err
	}},
	{"OVERSOLD_ADMIN_TOKEN", "", "bearer token for admin routes; empty disables them", func(c *config, v string) error {
		c.AdminToken = v
		return nil
	}},
	{"OVERSOLD_MAX_IN_FLIGHT", strconv.Itoa(order.DefaultMaxInFlight), "API requests served at once; more are answered 503 at once", func(c *config, v string) (err error) {
		c.MaxInFlight, err = count(v, 1_000_000)
		return err
	}},
	{"OVERSOLD_REQUEST_TIMEOUT", order.DefaultRequestTimeout.String(), "bound on each API request, reading it included; longer than OVERSOLD_LOCK_WAIT", func(c *config, v string) (err error) {
		c.RequestTimeout, err = duration(v, false)
		return err
	}},
	{"OVERSOLD_MYSQL_MAX_CONNS", strconv.Itoa(storage.DefaultMaxConns), "MySQL connections per replica at most (see README: sizing)", func(c *config, v string) (err error) {
		c.MySQLMaxConns, err = count(v, 100_000)
		return err
	}},
}

// flagName is the variable's flag: OVERSOLD_LOCK_TTL is lock-ttl.
func flagName(env string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, "OVERSOLD_")), "_", "-")
}

// configError is a bad setting: orderd exits with status 2.
type configError struct {
	Var string
	Err error
}

func (e *configError) Error() string { return e.Var + ": " + e.Err.Error() }
func (e *configError) Unwrap() error { return e.Err }

// parseConfig reads the settings from the flags in args and from getenv.
// A flag that is given wins over the variable, which wins over the default.
func parseConfig(args []string, getenv func(string) string) (config, error) {
	fs := flag.NewFlagSet("orderd", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run prints the one line
	flags := make([]*string, len(settings))
	for i, s := range settings {
		flags[i] = fs.String(flagName(s.env), "", s.usage)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return config{}, err
		}
		return config{}, &configError{Var: "flags", Err: err}
	}
	if err := refuseLabOnly(getenv); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, &configError{Var: "flags", Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	given := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })

	var c config
	for i, s := range settings {
		v := s.def
		if e := getenv(s.env); e != "" {
			v = e
		}
		if given[flagName(s.env)] {
			v = *flags[i]
		}
		if err := s.set(&c, v); err != nil {
			return config{}, &configError{Var: s.env, Err: err}
		}
	}
	return c, c.checkPairs()
}

// tokenless are the locks whose leases carry no fencing token that is safe
// across replicas: none has no lease, local's token counts per process only,
// redlock has none (docs/design.md, "Lock backends").
var tokenless = []string{"none", "local", "redlock"}

// checkPairs refuses the settings that are each valid but wrong together.
func (c config) checkPairs() error {
	if c.RequestTimeout <= c.LockWait {
		return &configError{Var: "OVERSOLD_REQUEST_TIMEOUT", Err: fmt.Errorf(
			"%v must be longer than OVERSOLD_LOCK_WAIT=%v, or every lock wait ends as a timed-out request", c.RequestTimeout, c.LockWait)}
	}
	if c.Guard.Fenced() && slices.Contains(tokenless, c.Lock) {
		return &configError{Var: "OVERSOLD_GUARD", Err: fmt.Errorf(
			"fencing needs fencing tokens, and OVERSOLD_LOCK=%s has none (want a lock of redis, zookeeper, mysql, etcd, or another guard)", c.Lock)}
	}
	if c.Accept == "queue" && c.Gate != "redis" {
		return &configError{Var: "OVERSOLD_ACCEPT", Err: fmt.Errorf(
			"queue takes the stock at the gate, and OVERSOLD_GATE=%s (want OVERSOLD_GATE=redis, or accept sync)", c.Gate)}
	}
	return nil
}

// usage prints the table, for --help.
func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: orderd [flags]\n\nEach flag may also be set by its variable; a flag wins.")
	for _, s := range settings {
		def := ""
		if s.def != "" {
			def = " (default " + s.def + ")"
		}
		fmt.Fprintf(w, "  --%-16s %-25s %s%s\n", flagName(s.env), s.env, s.usage, def)
	}
}

// duration parses a Go duration that must not be negative, nor zero unless
// zeroOK.
func duration(v string, zeroOK bool) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return 0, err
	case d < 0:
		return 0, fmt.Errorf("%v is negative", d)
	case d == 0 && !zeroOK:
		return 0, errors.New("must be greater than 0")
	}
	return d, nil
}

// count parses a whole number from 1 to most.
func count(v string, most int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > most {
		return 0, fmt.Errorf("%q is not a whole number from 1 to %d", v, most)
	}
	return n, nil
}

// hostPorts splits a comma-separated list of host:port addresses; an
// address may carry an http:// or https:// scheme (etcd endpoints do).
func hostPorts(v string) ([]string, error) {
	var out []string
	for a := range strings.SplitSeq(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		hp := strings.TrimPrefix(strings.TrimPrefix(a, "http://"), "https://")
		if err := checkHostPort(hp); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

func checkHostPort(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return fmt.Errorf("address %q: bad port %q", a, port)
	}
	return nil
}
