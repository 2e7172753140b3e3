package testbed

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Environment variables naming servers to use instead of starting them.
const (
	EnvMySQLDSN       = "OVERSOLD_TEST_MYSQL_DSN"
	EnvRedisAddr      = "OVERSOLD_TEST_REDIS_ADDR"
	EnvRedlockAddrs   = "OVERSOLD_TEST_REDLOCK_ADDRS"
	EnvZKServers      = "OVERSOLD_TEST_ZK_SERVERS"
	EnvEtcdEndpoints  = "OVERSOLD_TEST_ETCD_ENDPOINTS"
	EnvRequireServers = "OVERSOLD_REQUIRE_SERVERS"
)

// lazy is a server one test binary starts at most once.
type lazy struct {
	mu  sync.Mutex
	srv *Server
	err error
	ran bool
}

var shared = map[string]*lazy{KindMariaDB: {}, KindZooKeeper: {}, KindEtcd: {}}

// Main runs the tests and then stops the shared servers; use it as
//
//	func TestMain(m *testing.M) { testbed.Main(m) }
//
// Without it the shared servers still die with the test binary
// (Pdeathsig, or the container reaper), but their temp dirs stay behind.
func Main(m *testing.M) {
	code := m.Run()
	StopShared()
	RemoveContainers()
	os.Exit(code)
}

// StopShared stops the shared servers started by the test helpers. Main
// calls it; a TestMain that needs more control may call it itself.
func StopShared() {
	stopSharedClusters()
	for _, l := range shared {
		l.mu.Lock()
		if l.srv != nil {
			l.srv.Stop()
		}
		l.srv, l.err, l.ran = nil, nil, false
		l.mu.Unlock()
	}
}

func sharedServer(t testing.TB, kind string, start func(context.Context, Options) (*Server, error)) *Server {
	t.Helper()
	needBinary(t, kind)
	l := shared[kind]
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ran {
		l.ran = true
		// Not t.Context(): the server outlives this test.
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		l.srv, l.err = start(ctx, Options{})
		cancel()
	}
	if l.err != nil {
		t.Fatalf("testbed: shared %s: %v", kind, l.err)
	}
	return l.srv
}

// needBinary skips the test when the server is not installed, or fails it
// when OVERSOLD_REQUIRE_SERVERS=1.
func needBinary(t testing.TB, kind string) {
	t.Helper()
	cmd := Missing(kind)
	if cmd == "" {
		return
	}
	msg := fmt.Sprintf("testbed: %s is not installed: %s", kind, cmd)
	if os.Getenv(EnvRequireServers) == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// MySQL returns the DSN (parseTime=true) of a fresh empty database on the
// shared MariaDB, or on the server in OVERSOLD_TEST_MYSQL_DSN. The database
// is dropped when the test ends.
func MySQL(t testing.TB) string {
	t.Helper()
	var server string
	if env := os.Getenv(EnvMySQLDSN); env != "" {
		server = env
	} else {
		server = sharedServer(t, KindMariaDB, StartMariaDB).DSN("")
	}
	cfg, err := mysql.ParseDSN(server)
	if err != nil {
		t.Fatalf("testbed: %s: %v", EnvMySQLDSN, err)
	}
	cfg.DBName = ""
	admin := cfg.FormatDSN()
	name := "test_" + sanitize(strings.ToLower(t.Name()), 32, '_') + "_" + randHex()

	// One short-lived connection pool per statement: a pool kept open would
	// show up as a leaked goroutine in goleak checks.
	exec := func(ctx context.Context, q string) error {
		db, err := sql.Open("mysql", admin)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, q)
		return err
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := exec(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatalf("testbed: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		// t.Context() is already done here; a DROP waits for metadata locks
		// of transactions the test left open, so bound it.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Logf("testbed: drop database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	cfg.ParseTime = true
	return cfg.FormatDSN()
}

// Redis returns the address of a fresh private redis-server for this test,
// stopped when the test ends, or OVERSOLD_TEST_REDIS_ADDR (shared: keep to
// Prefix(t)).
func Redis(t testing.TB) string {
	t.Helper()
	if env := os.Getenv(EnvRedisAddr); env != "" {
		return env
	}
	return startRedises(t, 1)[0]
}

// Redises returns n independent Redis masters (for Redlock): fresh private
// servers stopped when the test ends, or the first n of
// OVERSOLD_TEST_REDLOCK_ADDRS.
func Redises(t testing.TB, n int) []string {
	t.Helper()
	if env := splitList(os.Getenv(EnvRedlockAddrs)); len(env) > 0 {
		if len(env) < n {
			t.Fatalf("testbed: %s has %d addresses, the test needs %d", EnvRedlockAddrs, len(env), n)
		}
		return env[:n]
	}
	return startRedises(t, n)
}

func startRedises(t testing.TB, n int) []string {
	t.Helper()
	needBinary(t, KindRedis)
	srvs := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { srvs[i], errs[i] = StartRedis(t.Context(), Options{}) })
	}
	wg.Wait()
	addrs := make([]string, 0, n)
	for _, s := range srvs {
		if s != nil {
			t.Cleanup(func() { s.Stop() })
			addrs = append(addrs, s.Addr)
		}
	}
	for _, err := range errs {
		if err != nil {
			t.Fatalf("testbed: %v", err)
		}
	}
	return addrs
}

// ZooKeeper returns the servers of the shared ZooKeeper, or
// OVERSOLD_TEST_ZK_SERVERS.
func ZooKeeper(t testing.TB) []string {
	t.Helper()
	if env := splitList(os.Getenv(EnvZKServers)); len(env) > 0 {
		return env
	}
	return []string{sharedServer(t, KindZooKeeper, StartZooKeeper).Addr}
}

// Etcd returns the endpoints (host:port) of the shared etcd, or
// OVERSOLD_TEST_ETCD_ENDPOINTS.
func Etcd(t testing.TB) []string {
	t.Helper()
	if env := splitList(os.Getenv(EnvEtcdEndpoints)); len(env) > 0 {
		return env
	}
	return []string{sharedServer(t, KindEtcd, StartEtcd).Addr}
}

// Prefix returns a key/path prefix unique to this test run, made of letters,
// digits, '-' and '_' only, so it is safe in Redis keys, ZooKeeper paths and
// etcd keys: "t-<name>-<random>".
func Prefix(t testing.TB) string {
	return "t-" + sanitize(t.Name(), 40, '-') + "-" + randHex()
}

// sanitize keeps letters, digits, '-' and '_', replaces the rest with sep
// and cuts to n bytes.
func sanitize(s string, n int, sep byte) string {
	b := []byte(s)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			b[i] = sep
		}
	}
	if len(b) > n {
		b = b[:n]
	}
	return string(b)
}

func randHex() string { return fmt.Sprintf("%08x", rand.Uint32()) }

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
