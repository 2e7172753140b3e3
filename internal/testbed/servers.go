package testbed

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
)

// leanMariaDB keeps startup fast and memory small without touching
// durability (innodb_flush_log_at_trx_commit and friends keep their
// defaults; pass e.g. "--innodb-flush-log-at-trx-commit=2" in Options.Args).
var leanMariaDB = []string{
	"--skip-name-resolve",
	"--innodb-buffer-pool-size=32M",
	"--innodb-log-file-size=16M",                        // the 96M default costs a 96M write at install
	"--innodb-temp-data-file-path=ibtmp1:1M:autoextend", // written in full at every start
	"--performance-schema=OFF",
	"--key-buffer-size=1M",
	"--aria-pagecache-buffer-size=8M",
}

// StartMariaDB starts a private mariadbd. root has no password and may
// connect over TCP from 127.0.0.1 (see DSN). The data directory is created
// with mariadb-install-db on the first start in Dir.
func StartMariaDB(ctx context.Context, o Options) (*Server, error) {
	return start(ctx, spec{
		kind:   KindMariaDB,
		nports: 1,
		setup:  installMariaDB,
		ctr:    mysqlContainer,
		argv: func(s *Server) []string {
			argv := []string{
				mustPath("mariadbd"), "--no-defaults",
				"--datadir=" + filepath.Join(s.Dir, "data"),
				"--socket=" + filepath.Join(s.Dir, "sock"),
				"--pid-file=" + filepath.Join(s.Dir, "mariadb.pid"),
				"--tmpdir=" + filepath.Join(s.Dir, "tmp"),
				"--port=" + strconv.Itoa(s.ports[0]),
				"--bind-address=127.0.0.1",
				"--max-connections=500", // many replicas, each with a pool
				// --no-defaults drops Debian's utf8mb4 default for latin1.
				"--character-set-server=utf8mb4",
				"--collation-server=utf8mb4_general_ci",
			}
			argv = append(argv, leanMariaDB...)
			argv = append(argv, rootUser()...)
			return append(argv, s.opts.Args...)
		},
		ready: func(ctx context.Context, s *Server) error {
			db, err := sql.Open("mysql", s.DSN("")+"&timeout=2s")
			if err != nil {
				return err
			}
			defer db.Close()
			var one int
			return db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
		},
	}, o)
}

// rootUser lets mariadbd run as root, which it refuses by default.
func rootUser() []string {
	if os.Geteuid() == 0 {
		return []string{"--user=root"}
	}
	return nil
}

// installMariaDB creates the system tables unless Dir already has them.
// --auth-root-authentication-method=normal gives root@localhost,
// root@127.0.0.1 and root@::1 without a password; --skip-name-resolve keeps
// those grants matching by IP.
func installMariaDB(ctx context.Context, s *Server) error {
	data := filepath.Join(s.Dir, "data")
	if _, err := os.Stat(filepath.Join(data, "mysql")); err == nil {
		return nil
	}
	// A private tmpdir: concurrent bootstraps sharing /tmp failed now and
	// then ("Could not remove temporary table", even a crash).
	tmp := filepath.Join(s.Dir, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	args := []string{
		"--no-defaults",
		"--datadir=" + data,
		"--auth-root-authentication-method=normal",
		"--skip-test-db",
	}
	args = append(args, leanMariaDB...)
	args = append(args, rootUser()...)
	args = append(args, "--tmpdir="+tmp)
	cmd := exec.CommandContext(ctx, mustPath("mariadb-install-db"), args...)
	out, err := cmd.CombinedOutput()
	os.WriteFile(filepath.Join(s.Dir, "install.log"), out, 0o644)
	if err != nil {
		os.RemoveAll(data) // a half-made datadir would be skipped next time
		return fmt.Errorf("mariadb-install-db: %w; errors:\n%s", err, errorLines(string(out)))
	}
	return nil
}

// DSN returns a go-sql-driver DSN for root over TCP to database ("" for
// none), with parseTime=true. It is "" for servers other than MariaDB.
func (s *Server) DSN(database string) string {
	if s.Kind != KindMariaDB {
		return ""
	}
	c := mysql.NewConfig()
	c.User, c.Net, c.Addr, c.DBName, c.ParseTime = "root", "tcp", s.Addr, database, true
	return c.FormatDSN()
}

// StartRedis starts a private redis-server without persistence: after a Kill
// and Restart it is empty, like a node restarted without AOF (the Redlock
// failure case).
func StartRedis(ctx context.Context, o Options) (*Server, error) {
	return start(ctx, spec{
		kind:   KindRedis,
		nports: 1,
		setup:  func(context.Context, *Server) error { return nil },
		ctr:    redisContainer,
		argv: func(s *Server) []string {
			argv := []string{
				mustPath("redis-server"),
				"--port", strconv.Itoa(s.ports[0]),
				"--bind", "127.0.0.1",
				"--save", "",
				"--appendonly", "no",
				"--dir", s.Dir,
				"--daemonize", "no",
			}
			return append(argv, s.opts.Args...)
		},
		ready: pingRedis,
	}, o)
}

// StartSentinel starts a redis-sentinel monitoring masterAddr (an IP:port)
// as masterName, with short timeouts so failovers happen within seconds.
func StartSentinel(ctx context.Context, masterName, masterAddr string, quorum int, o Options) (*Server, error) {
	host, port, err := net.SplitHostPort(masterAddr)
	if err != nil {
		return nil, fmt.Errorf("start sentinel: master address: %w", err)
	}
	return start(ctx, spec{
		kind:   KindSentinel,
		nports: 1,
		ctr:    sentinelContainer(masterName, host, port, quorum),
		// Sentinel rewrites its config as it learns, so it must be a file.
		setup: func(_ context.Context, s *Server) error {
			conf := fmt.Sprintf(`port %d
bind 127.0.0.1
daemonize no
logfile ""
dir %s
sentinel resolve-hostnames no
sentinel monitor %s %s %s %d
sentinel down-after-milliseconds %[3]s 1000
sentinel failover-timeout %[3]s 3000
sentinel parallel-syncs %[3]s 1
`, s.ports[0], s.Dir, masterName, host, port, quorum)
			return os.WriteFile(filepath.Join(s.Dir, "sentinel.conf"), []byte(conf), 0o644)
		},
		argv: func(s *Server) []string {
			argv := []string{mustPath("redis-sentinel"), filepath.Join(s.Dir, "sentinel.conf")}
			return append(argv, s.opts.Args...)
		},
		ready: pingRedis,
	}, o)
}

func pingRedis(ctx context.Context, s *Server) error {
	c := redis.NewClient(&redis.Options{
		Addr:            s.Addr,
		Protocol:        2,
		DisableIdentity: true,
		MaxRetries:      -1,
		PoolSize:        1,
		DialTimeout:     2 * time.Second,
	})
	defer c.Close()
	return c.Ping(ctx).Err()
}

const zkJar = "/usr/share/java/zookeeper.jar"

// zkReaping makes the server remove an empty container node (a lock key's
// parent, once its last waiter is gone) within a second, and unpaced: the
// default, a check a minute at most 10000 deletions a minute, falls behind
// a shop adding 100 000 SKUs a minute. JVM options: ZooKeeper reads them
// as system properties, not from zoo.cfg. docker-compose.yml sets the same.
var zkReaping = []string{"-Dznode.container.checkIntervalMs=1000", "-Dznode.container.maxPerMinute=600000"}

// zkClasspath is Debian's: zookeeper.jar's manifest Class-Path names its
// dependencies, but no slf4j binding, so ZooKeeper would log nothing. The
// log4j 1.2 binding sends its log to our log4j.properties.
func zkClasspath() string {
	cp := []string{zkJar}
	for _, j := range []string{"/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar"} {
		if _, err := os.Stat(j); err == nil {
			cp = append(cp, j)
		}
	}
	return strings.Join(cp, ":")
}

// StartZooKeeper starts a standalone ZooKeeper with a 200 ms tick, so
// sessions may be as short as 400 ms. Options.Args: "-..." are JVM options,
// "key=value" are extra zoo.cfg lines.
func StartZooKeeper(ctx context.Context, o Options) (*Server, error) {
	var jvm, cfg []string
	for _, a := range o.Args {
		if strings.HasPrefix(a, "-") {
			jvm = append(jvm, a)
		} else {
			cfg = append(cfg, a)
		}
	}
	return start(ctx, spec{
		kind:   KindZooKeeper,
		nports: 1,
		ctr:    zkContainer(jvm, cfg),
		setup: func(_ context.Context, s *Server) error {
			zoo := zooCfg(s, filepath.Join(s.Dir, "data"), cfg)
			// To stdout, which goes to our log: Debian's default file
			// appender would write to /var/log/zookeeper.
			log4j := `log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
`
			if err := os.WriteFile(filepath.Join(s.Dir, "zoo.cfg"), []byte(zoo), 0o644); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(s.Dir, "log4j.properties"), []byte(log4j), 0o644)
		},
		argv: func(s *Server) []string {
			argv := []string{
				mustPath("java"),
				"-Xmx256m",
				"-XX:+UseSerialGC", // fewer threads on a shared 2-core box
				"-XX:-UsePerfData", // no /tmp/hsperfdata_* files
				"-Djava.awt.headless=true",
				"-Djava.net.preferIPv4Stack=true",
				"-Dzookeeper.jmx.log4j.disable=true",
				"-Dlog4j.configuration=file:" + filepath.Join(s.Dir, "log4j.properties"),
				"-Dzookeeper.log.dir=" + s.Dir,
			}
			argv = append(append(argv, zkReaping...), jvm...)
			return append(argv, "-cp", zkClasspath(),
				"org.apache.zookeeper.server.quorum.QuorumPeerMain",
				filepath.Join(s.Dir, "zoo.cfg"))
		},
		ready: pingZooKeeper,
	}, o)
}

// zooCfg is a standalone zoo.cfg, the extra lines cfg last.
func zooCfg(s *Server, dataDir string, cfg []string) string {
	zoo := fmt.Sprintf(`dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
tickTime=200
minSessionTimeout=400
maxSessionTimeout=60000
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,mntr,stat,cons,wchs
`, dataDir, s.ports[0])
	return zoo + strings.Join(append(cfg, ""), "\n")
}

// pingZooKeeper asks srvr rather than ruok: ruok answers as soon as the
// socket is open, srvr only once the server serves requests.
func pingZooKeeper(ctx context.Context, s *Server) error {
	_, err := zkMode(ctx, s.Addr)
	return err
}

// StartEtcd starts a single-member etcd cluster; Addr is the client URL's
// host:port, and a second free port serves peers.
func StartEtcd(ctx context.Context, o Options) (*Server, error) {
	return start(ctx, spec{
		kind:   KindEtcd,
		nports: 2,
		setup:  func(context.Context, *Server) error { return nil },
		ctr:    etcdContainer,
		argv: func(s *Server) []string {
			return append([]string{mustPath("etcd")}, etcdFlags(s, filepath.Join(s.Dir, "data"))...)
		},
		ready: pingEtcd,
	}, o)
}

// etcdFlags are a single member's flags, Options.Args last.
func etcdFlags(s *Server, dataDir string) []string {
	client := "http://" + s.Addr
	peer := fmt.Sprintf("http://127.0.0.1:%d", s.ports[1])
	flags := []string{
		"--name=default",
		"--data-dir=" + dataDir,
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=default=" + peer,
		"--initial-cluster-state=new",
		"--logger=zap",
		"--log-outputs=stderr",
		// Every lock grant is a revision: without compaction the
		// database grows until it hits its quota.
		"--auto-compaction-mode=revision",
		"--auto-compaction-retention=10000",
	}
	return append(flags, s.opts.Args...)
}

// healthClient keeps no idle connections, so no goroutine outlives a check
// (goleak runs in the locking tests).
var healthClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// pingEtcd uses /health, which in etcd 3.4 needs a leader and a served
// read; it keeps the gRPC client out of every test binary.
func pingEtcd(ctx context.Context, s *Server) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Addr+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := healthClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
		return errors.New("etcd /health: " + resp.Status + " " + strings.TrimSpace(string(body)))
	}
	return nil
}

// errorLines picks mariadbd's [ERROR] lines out of mariadb-install-db's
// output, which ends in a screenful of generic advice.
func errorLines(out string) string {
	var errs []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "[ERROR]") || strings.Contains(l, "rror:") {
			errs = append(errs, l)
		}
	}
	if len(errs) == 0 {
		return tailString(out, 30)
	}
	return tailString(strings.Join(errs, "\n"), 20)
}

func tailString(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
