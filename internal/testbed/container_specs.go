package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// What each kind runs in its container: the same settings as its process
// (servers.go), in the official images' terms, so the stand-in images of
// deploy/images and the official ones both take them. Options.Args come
// last, so they win, as for processes.

// mysqlContainer: options both MySQL 8.4 and MariaDB accept (not
// leanMariaDB's aria and log-file sizes); root without a password from
// anywhere, like the process' root over TCP.
func mysqlContainer(s *Server) ctrSpec {
	cmd := []string{
		"mysqld",
		"--port=" + strconv.Itoa(s.ports[0]),
		"--bind-address=127.0.0.1",
		"--max-connections=500",
		"--character-set-server=utf8mb4",
		"--collation-server=utf8mb4_general_ci",
		"--skip-name-resolve",
		"--innodb-buffer-pool-size=32M",
		"--performance-schema=OFF",
	}
	return ctrSpec{
		cmd: append(cmd, s.opts.Args...),
		env: map[string]string{"MYSQL_ALLOW_EMPTY_PASSWORD": "yes"},
	}
}

func redisContainer(s *Server) ctrSpec {
	cmd := []string{
		"redis-server",
		"--port", strconv.Itoa(s.ports[0]),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", "/data",
		"--daemonize", "no",
	}
	return ctrSpec{cmd: append(cmd, s.opts.Args...)}
}

// sentinelContainer writes the process' sentinel.conf to /data, where the
// images' entrypoint makes it the redis user's (Sentinel rewrites it).
func sentinelContainer(masterName, host, port string, quorum int) func(s *Server) ctrSpec {
	return func(s *Server) ctrSpec {
		conf := fmt.Sprintf(`port %d
bind 127.0.0.1
daemonize no
logfile ""
dir /data
sentinel resolve-hostnames no
sentinel monitor %s %s %s %d
sentinel down-after-milliseconds %[2]s 1000
sentinel failover-timeout %[2]s 3000
sentinel parallel-syncs %[2]s 1
`, s.ports[0], masterName, host, port, quorum)
		return ctrSpec{
			cmd:   append([]string{"redis-server", "/data/sentinel.conf", "--sentinel"}, s.opts.Args...),
			files: map[string]string{"/data/sentinel.conf": conf},
		}
	}
}

// zkContainer gives the image a complete /conf/zoo.cfg (so its entrypoint
// writes none) and the JVM options in JVMFLAGS.
func zkContainer(jvm, cfg []string) func(s *Server) ctrSpec {
	return func(s *Server) ctrSpec {
		zoo := zooCfg(s, "/data", cfg)
		flags := append([]string{"-Xmx256m", "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true"}, zkReaping...)
		flags = append(flags, jvm...)
		files := map[string]string{"/conf/zoo.cfg": zoo}
		// An ensemble member's id, written to Dir/data by the caller
		// (StartZooKeeperEnsemble), else the image writes ZOO_MY_ID or 1.
		if id, err := os.ReadFile(filepath.Join(s.Dir, "data", "myid")); err == nil {
			files["/data/myid"] = string(id)
		}
		return ctrSpec{
			cmd:   []string{"zkServer.sh", "start-foreground"},
			env:   map[string]string{"JVMFLAGS": strings.Join(flags, " ")},
			files: files,
		}
	}
}

func etcdContainer(s *Server) ctrSpec {
	return ctrSpec{cmd: append([]string{"etcd"}, etcdFlags(s, "/etcd-data")...)}
}
