package testbed_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oversold-lab/oversold/internal/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// need skips like the helpers do when a binary is missing.
func need(t *testing.T, kind string) {
	t.Helper()
	if cmd := testbed.Missing(kind); cmd != "" {
		if os.Getenv(testbed.EnvRequireServers) == "1" {
			t.Fatalf("%s is not installed: %s", kind, cmd)
		}
		t.Skipf("%s is not installed: %s", kind, cmd)
	}
}

func startRedis(t *testing.T, o testbed.Options) *testbed.Server {
	t.Helper()
	need(t, testbed.KindRedis)
	begin := time.Now()
	s, err := testbed.StartRedis(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("redis %s ready in %v", s.Addr, time.Since(begin).Round(time.Millisecond))
	t.Cleanup(func() { s.Stop() })
	return s
}

func redisClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ReadTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestMissing(t *testing.T) {
	if got := testbed.Missing("nope"); got == "" {
		t.Error(`Missing("nope") = "", want a complaint`)
	}
	for _, kind := range []string{"mariadb", "redis", "sentinel", "zookeeper", "etcd"} {
		if got := testbed.Missing(kind); got != "" && !strings.HasPrefix(got, "apt-get install -y ") {
			t.Errorf("Missing(%q) = %q, want an apt-get command or \"\"", kind, got)
		}
	}
}

func TestRedisKillRestartPause(t *testing.T) {
	t.Parallel()
	s := startRedis(t, testbed.Options{})
	ctx := t.Context()
	c := redisClient(t, s.Addr)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET k = %q, %v; want v", got, err)
	}

	// Paused: the connection stays open but nothing answers.
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Error("PING answered while paused")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		// The timed-out PING may leave a late reply on a pooled conn; one
		// retry on a fresh connection is what clients do too.
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("PING after resume: %v", err)
		}
	}

	// Killed and restarted on the same port: data is gone (no persistence).
	pid, addr, dir := s.Pid(), s.Addr, s.Dir
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if s.Pid() != 0 {
		t.Error("Pid() != 0 after Kill")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Addr != addr || s.Dir != dir || s.Pid() == pid || s.Pid() == 0 {
		t.Errorf("after restart: addr %s dir %s pid %d; before: %s %s %d", s.Addr, s.Dir, s.Pid(), addr, dir, pid)
	}
	c2 := redisClient(t, s.Addr)
	if err := c2.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("GET k after kill and restart: %v, want redis.Nil", err)
	}

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("Dir %s still there after Stop: %v", dir, err)
	}
	if err := s.Restart(ctx); err == nil {
		t.Error("Restart after Stop removed Dir succeeded")
	}
}

func TestRedisArgsAndOwnDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startRedis(t, testbed.Options{Dir: dir, Args: []string{"--maxmemory", "7mb"}})
	got, err := redisClient(t, s.Addr).ConfigGet(t.Context(), "maxmemory").Result()
	if err != nil || got["maxmemory"] != strconv.Itoa(7<<20) {
		t.Errorf("maxmemory = %v, %v; want %d", got, err, 7<<20)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("given Dir removed by Stop: %v", err)
	}
	// Stop without removal allows a restart.
	if err := s.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := redisClient(t, s.Addr).Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestPortTakenFailsWithLog(t *testing.T) {
	t.Parallel()
	need(t, testbed.KindRedis)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	_, err = testbed.StartRedis(t.Context(), testbed.Options{Port: port})
	if err == nil {
		t.Fatal("started on a taken port")
	}
	if !strings.Contains(strings.ToLower(err.Error()), "address already in use") {
		t.Errorf("error lacks the log tail: %v", err)
	}
}

func TestSentinelSeesMaster(t *testing.T) {
	t.Parallel()
	need(t, testbed.KindSentinel)
	master := startRedis(t, testbed.Options{})
	begin := time.Now()
	s, err := testbed.StartSentinel(t.Context(), "mymaster", master.Addr, 1, testbed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sentinel %s ready in %v", s.Addr, time.Since(begin).Round(time.Millisecond))
	t.Cleanup(func() { s.Stop() })

	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	defer sc.Close()
	ctx := t.Context()
	addr, err := sc.GetMasterAddrByName(ctx, "mymaster").Result()
	if err != nil || net.JoinHostPort(addr[0], addr[1]) != master.Addr {
		t.Fatalf("get-master-addr-by-name = %v, %v; want %s", addr, err, master.Addr)
	}
	// The run id comes from the master's INFO: the sentinel really talks to it.
	runID := regexp.MustCompile(`run_id:(\w+)`).FindStringSubmatch(redisClient(t, master.Addr).Info(ctx, "server").Val())
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := sc.Master(ctx, "mymaster").Result()
		if err == nil && len(runID) == 2 && m["runid"] == runID[1] && m["flags"] == "master" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel master = %v, %v; want runid %v and flags master", m, err, runID)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRedisHelpers(t *testing.T) {
	t.Parallel()
	addrs := testbed.Redises(t, 3)
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Errorf("Redises returned %s twice", a)
		}
		seen[a] = true
		if err := redisClient(t, a).Ping(t.Context()).Err(); err != nil {
			t.Error(err)
		}
	}
}

// Not parallel: t.Setenv.
func TestEnvTakesPrecedence(t *testing.T) {
	s := startRedis(t, testbed.Options{})
	t.Setenv(testbed.EnvRedisAddr, s.Addr)
	if got := testbed.Redis(t); got != s.Addr {
		t.Errorf("Redis(t) = %s, want %s from %s", got, s.Addr, testbed.EnvRedisAddr)
	}
	t.Setenv(testbed.EnvRedlockAddrs, " a:1, b:2 ,c:3")
	if got := testbed.Redises(t, 2); strings.Join(got, ",") != "a:1,b:2" {
		t.Errorf("Redises(t, 2) = %v, want [a:1 b:2]", got)
	}
	t.Setenv(testbed.EnvZKServers, "z:1")
	if got := testbed.ZooKeeper(t); len(got) != 1 || got[0] != "z:1" {
		t.Errorf("ZooKeeper(t) = %v", got)
	}
	t.Setenv(testbed.EnvEtcdEndpoints, "e:1,e:2")
	if got := testbed.Etcd(t); len(got) != 2 {
		t.Errorf("Etcd(t) = %v", got)
	}
}

func TestMySQL(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	dsns := []string{testbed.MySQL(t), testbed.MySQL(t)}
	t.Logf("shared mariadb and two databases in %v", time.Since(begin).Round(time.Millisecond))
	if dsns[0] == dsns[1] {
		t.Fatalf("MySQL(t) returned %s twice", dsns[0])
	}
	names := map[string]bool{}
	for _, dsn := range dsns {
		if !strings.Contains(dsn, "parseTime=true") {
			t.Errorf("DSN %s lacks parseTime=true", dsn)
		}
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var name string
		var tables int
		if err := db.QueryRowContext(t.Context(), "SELECT DATABASE()").Scan(&name); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()").Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables != 0 {
			t.Errorf("database %s has %d tables, want none", name, tables)
		}
		names[name] = true
		if _, err := db.ExecContext(t.Context(), "CREATE TABLE t (id INT PRIMARY KEY, at DATETIME)"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(t.Context(), "INSERT INTO t VALUES (1, NOW())"); err != nil {
			t.Fatal(err)
		}
		var at time.Time // parseTime=true scans DATETIME into time.Time
		if err := db.QueryRowContext(t.Context(), "SELECT at FROM t").Scan(&at); err != nil {
			t.Fatal(err)
		}
	}
	if len(names) != 2 {
		t.Errorf("databases %v, want two different ones", names)
	}
}

func TestMariaDBRestartKeepsData(t *testing.T) {
	t.Parallel()
	need(t, testbed.KindMariaDB)
	begin := time.Now()
	s, err := testbed.StartMariaDB(t.Context(), testbed.Options{Args: []string{"--innodb-flush-log-at-trx-commit=2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("mariadb %s ready in %v (pid %d)", s.Addr, time.Since(begin).Round(time.Millisecond), s.Pid())
	t.Cleanup(func() { s.Stop() })
	ctx := t.Context()
	query := func(q string, dest ...any) {
		t.Helper()
		db, err := sql.Open("mysql", s.DSN(""))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if len(dest) == 0 {
			_, err = db.ExecContext(ctx, q)
		} else {
			err = db.QueryRowContext(ctx, q).Scan(dest...)
		}
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var flush int
	var charset string
	query("SELECT @@innodb_flush_log_at_trx_commit, @@character_set_server", &flush, &charset)
	if flush != 2 || charset != "utf8mb4" {
		t.Errorf("flush_log_at_trx_commit %d, charset %s; want 2 (from Args), utf8mb4", flush, charset)
	}
	query("CREATE DATABASE keep")
	query("CREATE TABLE keep.t (v INT)")
	query("INSERT INTO keep.t VALUES (42)")
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	begin = time.Now()
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("mariadb restart after kill -9 in %v", time.Since(begin).Round(time.Millisecond))
	var v int
	query("SELECT v FROM keep.t", &v)
	if v != 42 {
		t.Errorf("after restart v = %d, want 42", v)
	}
}

func TestZooKeeper(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	servers := testbed.ZooKeeper(t)
	t.Logf("shared zookeeper %v ready in %v", servers, time.Since(begin).Round(time.Millisecond))
	conn, _, err := zk.Connect(servers, time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	path := "/" + testbed.Prefix(t)
	if _, err := conn.Create(path, []byte("hello"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	got, _, err := conn.Get(path)
	if err != nil || string(got) != "hello" {
		t.Fatalf("get %s = %q, %v", path, got, err)
	}
	if ok := zk.FLWRuok(servers, time.Second); len(ok) != 1 || !ok[0] {
		t.Errorf("ruok = %v", ok)
	}
}

func TestEtcd(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	endpoints := testbed.Etcd(t)
	t.Logf("shared etcd %v ready in %v", endpoints, time.Since(begin).Round(time.Millisecond))
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	key := testbed.Prefix(t) + "/k"
	if _, err := c.Put(ctx, key, "v"); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get %s = %v, %v", key, resp, err)
	}
}

func TestPrefix(t *testing.T) {
	t.Run("sub/test with spaces", func(t *testing.T) {
		a, b := testbed.Prefix(t), testbed.Prefix(t)
		if a == b {
			t.Errorf("Prefix twice = %s", a)
		}
		if !regexp.MustCompile(`^t-[A-Za-z0-9_-]+$`).MatchString(a) {
			t.Errorf("Prefix = %q, want only [A-Za-z0-9_-]", a)
		}
	})
}
