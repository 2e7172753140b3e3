package main

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/storage"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestConfigDefaults(t *testing.T) {
	c, err := parseConfig(nil, env())
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if c.Addr != ":8080" || c.Instance != host || c.Lock != "redis" || c.Guard != storage.GuardVersion ||
		c.LockTTL != 10*time.Second || c.LockWait != 5*time.Second || c.WorkDelay != 0 || c.AdminToken != "" ||
		c.MySQLDSN != "root@tcp(127.0.0.1:3306)/oversold?parseTime=true" || c.Database != "oversold" ||
		c.RedisAddr != "127.0.0.1:6379" || len(c.RedlockAddrs) != 0 ||
		!slices.Equal(c.ZKServers, []string{"127.0.0.1:2181"}) || !slices.Equal(c.EtcdEndpoints, []string{"127.0.0.1:2379"}) ||
		c.MaxInFlight != 256 || c.RequestTimeout != 15*time.Second || c.MySQLMaxConns != 64 {
		t.Errorf("defaults: %+v", c)
	}
}

// TestConfigPrecedence: a given flag wins over the variable, which wins over
// the default.
func TestConfigPrecedence(t *testing.T) {
	for _, c := range []struct {
		name  string
		args  []string
		env   func(string) string
		check func(config) bool
	}{
		{"env over default", nil, env("OVERSOLD_LOCK", "local"), func(c config) bool { return c.Lock == "local" }},
		{"flag over env", []string{"--lock", "none"}, env("OVERSOLD_LOCK", "local"), func(c config) bool { return c.Lock == "none" }},
		{"flag with =", []string{"--lock-ttl=7s"}, env("OVERSOLD_LOCK_TTL", "3s"), func(c config) bool { return c.LockTTL == 7*time.Second }},
		{"single dash flag", []string{"-work-delay", "5ms"}, env(), func(c config) bool { return c.WorkDelay == 5*time.Millisecond }},
		{"empty flag wins", []string{"--admin-token="}, env("OVERSOLD_ADMIN_TOKEN", "t"), func(c config) bool { return c.AdminToken == "" }},
		{"env token", nil, env("OVERSOLD_ADMIN_TOKEN", "t"), func(c config) bool { return c.AdminToken == "t" }},
		{"instance", []string{"--instance", "r7"}, env("OVERSOLD_INSTANCE", "r1"), func(c config) bool { return c.Instance == "r7" }},
		{"lists", nil, env("OVERSOLD_REDLOCK_ADDRS", "a:1, b:2,c:3", "OVERSOLD_ETCD_ENDPOINTS", "http://e:2379,https://f:2379"), func(c config) bool {
			return slices.Equal(c.RedlockAddrs, []string{"a:1", "b:2", "c:3"}) && slices.Equal(c.EtcdEndpoints, []string{"http://e:2379", "https://f:2379"})
		}},
		{"guard", []string{"--guard", "fencing"}, env("OVERSOLD_GUARD", "atomic"), func(c config) bool { return c.Guard == storage.GuardFencing }},
		{"gate", []string{"--gate", "redis"}, env("OVERSOLD_GATE", "none"), func(c config) bool { return c.Gate == "redis" }},
		{"gate default", nil, env(), func(c config) bool { return c.Gate == "none" }},
		{"accept", []string{"--accept", "queue"}, env("OVERSOLD_ACCEPT", "sync", "OVERSOLD_GATE", "redis"), func(c config) bool { return c.Accept == "queue" }},
		{"accept default", nil, env(), func(c config) bool { return c.Accept == "sync" }},
		{"dsn", nil, env("OVERSOLD_MYSQL_DSN", "app:pw@tcp(db:3306)/shop"), func(c config) bool { return c.Database == "shop" }},
		{"sentinel redis", nil, env("OVERSOLD_REDIS_ADDR", "sentinel://m@a:26379,b:26379"), func(c config) bool { return c.RedisAddr == "sentinel://m@a:26379,b:26379" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseConfig(c.args, c.env)
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(got) {
				t.Errorf("%+v", got)
			}
		})
	}
}

// TestConfigErrors: every bad setting is one line naming the variable, and
// exit status 2.
func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  func(string) string
		want string // the whole message, or its start when it ends in "..."
	}{
		{nil, env("OVERSOLD_LOCK", "zk"), `OVERSOLD_LOCK: unknown lock "zk" (want none, local, redis, redlock, zookeeper, mysql, etcd)`},
		{[]string{"--lock", "Redis"}, env(), `OVERSOLD_LOCK: unknown lock "Redis"...`},
		{nil, env("OVERSOLD_GUARD", "strict"), `OVERSOLD_GUARD: unknown guard "strict" (want one of none, version, fencing, atomic)`},
		{nil, env("OVERSOLD_GATE", "Redis"), `OVERSOLD_GATE: unknown gate "Redis" (want none, redis)`},
		{[]string{"--gate", "memcached"}, env(), `OVERSOLD_GATE: unknown gate "memcached" (want none, redis)`},
		{nil, env("OVERSOLD_ACCEPT", "Queue"), `OVERSOLD_ACCEPT: unknown accept "Queue" (want sync, queue)`},
		{[]string{"--accept", "async"}, env("OVERSOLD_GATE", "redis"), `OVERSOLD_ACCEPT: unknown accept "async" (want sync, queue)`},
		{nil, env("OVERSOLD_ACCEPT", "queue"),
			`OVERSOLD_ACCEPT: queue takes the stock at the gate, and OVERSOLD_GATE=none (want OVERSOLD_GATE=redis, or accept sync)`},
		{[]string{"--accept", "queue"}, env("OVERSOLD_GATE", "none"), `OVERSOLD_ACCEPT: queue takes the stock at the gate, and OVERSOLD_GATE=none...`},
		{nil, env("OVERSOLD_LOCK_TTL", "abc"), `OVERSOLD_LOCK_TTL: time: invalid duration "abc"`},
		{[]string{"--lock-ttl", "abc"}, env(), `OVERSOLD_LOCK_TTL: time: invalid duration "abc"`},
		{nil, env("OVERSOLD_LOCK_TTL", "-1s"), `OVERSOLD_LOCK_TTL: -1s is negative`},
		{nil, env("OVERSOLD_LOCK_TTL", "10"), `OVERSOLD_LOCK_TTL: time: missing unit in duration "10"`},
		{nil, env("OVERSOLD_LOCK_WAIT", "0s"), `OVERSOLD_LOCK_WAIT: must be greater than 0`},
		{nil, env("OVERSOLD_WORK_DELAY", "-5ms"), `OVERSOLD_WORK_DELAY: -5ms is negative`},
		{nil, env("OVERSOLD_BATCH_MAX", "0"), `OVERSOLD_BATCH_MAX: "0" is not a whole number from 1 to 1000`},
		{[]string{"--batch-max", "x"}, env(), `OVERSOLD_BATCH_MAX: "x" is not a whole number from 1 to 1000`},
		{nil, env("OVERSOLD_BATCH_WAIT", "soon"), `OVERSOLD_BATCH_WAIT: time: invalid duration "soon"`},
		{nil, env("OVERSOLD_ADDR", "8080"), `OVERSOLD_ADDR: address 8080: missing port in address`},
		{nil, env("OVERSOLD_ADDR", ":99999"), `OVERSOLD_ADDR: address ":99999": bad port "99999"`},
		{nil, env("OVERSOLD_REDIS_ADDR", "localhost"), `OVERSOLD_REDIS_ADDR: redis address "localhost": address localhost: missing port in address`},
		{nil, env("OVERSOLD_REDLOCK_ADDRS", "a:1,b"), `OVERSOLD_REDLOCK_ADDRS: address b: missing port in address`},
		{nil, env("OVERSOLD_ZK_SERVERS", "zk:port"), `OVERSOLD_ZK_SERVERS: address "zk:port": bad port "port"`},
		{nil, env("OVERSOLD_ETCD_ENDPOINTS", "http://etcd"), `OVERSOLD_ETCD_ENDPOINTS: address etcd: missing port in address`},
		{nil, env("OVERSOLD_MYSQL_DSN", "garbage"), `OVERSOLD_MYSQL_DSN: invalid DSN: missing the slash separating the database name`},
		{nil, env("OVERSOLD_MYSQL_DSN", "root@tcp(db:3306)/"), `OVERSOLD_MYSQL_DSN: names no database`},
		{nil, env("OVERSOLD_INSTANCE", strings.Repeat("r", 256)), `OVERSOLD_INSTANCE: longer than 255 bytes`},
		{nil, env("OVERSOLD_GUARD", "fencing", "OVERSOLD_LOCK", "none"),
			`OVERSOLD_GUARD: fencing needs fencing tokens, and OVERSOLD_LOCK=none has none (want a lock of redis, zookeeper, mysql, etcd, or another guard)`},
		{[]string{"--guard", "fencing"}, env("OVERSOLD_LOCK", "local"), `OVERSOLD_GUARD: fencing needs fencing tokens, and OVERSOLD_LOCK=local has none...`},
		{[]string{"--lock", "redlock"}, env("OVERSOLD_GUARD", "fencing"), `OVERSOLD_GUARD: fencing needs fencing tokens, and OVERSOLD_LOCK=redlock has none...`},
		{nil, env("OVERSOLD_MAX_IN_FLIGHT", "0"), `OVERSOLD_MAX_IN_FLIGHT: "0" is not a whole number from 1 to 1000000`},
		{nil, env("OVERSOLD_MYSQL_MAX_CONNS", "many"), `OVERSOLD_MYSQL_MAX_CONNS: "many" is not a whole number from 1 to 100000`},
		{nil, env("OVERSOLD_REQUEST_TIMEOUT", "0s"), `OVERSOLD_REQUEST_TIMEOUT: must be greater than 0`},
		{nil, env("OVERSOLD_REQUEST_TIMEOUT", "5s"),
			`OVERSOLD_REQUEST_TIMEOUT: 5s must be longer than OVERSOLD_LOCK_WAIT=5s, or every lock wait ends as a timed-out request`},
		{[]string{"--nope"}, env(), `flags: flag provided but not defined: -nope`},
		{[]string{"serve"}, env(), `flags: unexpected argument "serve"`},
	} {
		_, err := parseConfig(c.args, c.env)
		var ce *configError
		if !errors.As(err, &ce) {
			t.Errorf("%v %v: err %v, want a configError", c.args, c.want, err)
			continue
		}
		msg := err.Error()
		if prefix, ok := strings.CutSuffix(c.want, "..."); ok && !strings.HasPrefix(msg, prefix) || !ok && msg != c.want {
			t.Errorf("message %q, want %q", msg, c.want)
		}
		if strings.Contains(msg, "\n") {
			t.Errorf("message %q spans lines", msg)
		}
		if exitCode(err) != 2 {
			t.Errorf("%q: exit status %d, want 2", msg, exitCode(err))
		}
	}
}

// TestFencingWithTokens: guard fencing starts with every lock that has
// fencing tokens (TestConfigErrors refuses the others).
func TestFencingWithTokens(t *testing.T) {
	for _, lock := range []string{"redis", "zookeeper", "mysql", "etcd"} {
		if _, err := parseConfig(nil, env("OVERSOLD_GUARD", "fencing", "OVERSOLD_LOCK", lock)); err != nil {
			t.Errorf("fencing with %s: %v", lock, err)
		}
	}
}

func TestFlagNames(t *testing.T) {
	var got []string
	for _, s := range settings {
		got = append(got, flagName(s.env))
	}
	want := []string{"addr", "instance", "mysql-dsn", "redis-addr", "redlock-addrs", "zk-servers", "etcd-endpoints",
		"lock", "guard", "gate", "accept", "lock-ttl", "lock-wait", "work-delay", "batch-max", "batch-wait", "reservation-ttl", "sweep-interval", "admin-token",
		"max-in-flight", "request-timeout", "mysql-max-conns"}
	if faultHooks {
		want = append(want, "fault-hook")
	}
	if !slices.Equal(got, want) {
		t.Errorf("flags %v, want %v", got, want)
	}
}
