package faults

import (
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// Paths a replica can have proxied.
const (
	pathLock  = "lock"  // its lock server(s), by backend
	pathMySQL = "mysql" // MariaDB: orders, stock, and the mysql lock
)

// proxyReplica puts proxies between replica i and the servers of path, and
// points the replica (only it) at them through run.ReplicaEnv. The lock path
// of backend mysql is MariaDB itself; that of redis is also the stock cache
// (docs/design.md: one setting for both), so a slow redis lock path slows the
// replica's cache too.
func proxyReplica(run *loadtest.Run, i int, path string) (testbed.Proxies, error) {
	if run.ReplicaEnv[i] == nil {
		run.ReplicaEnv[i] = map[string]string{}
	}
	env := run.ReplicaEnv[i]
	var ps testbed.Proxies
	one := func(addr string) (string, error) {
		p, err := testbed.StartProxy(fmt.Sprintf("r%d-%s-%d", i+1, path, len(ps)), addr)
		if err != nil {
			return "", err
		}
		ps = append(ps, p)
		return p.Addr(), nil
	}
	list := func(addrs []string) (string, error) {
		out := make([]string, len(addrs))
		for j, a := range addrs {
			scheme := ""
			if s, rest, ok := strings.Cut(a, "://"); ok { // etcd endpoints may be URLs
				scheme, a = s+"://", rest
			}
			p, err := one(a)
			if err != nil {
				return "", err
			}
			out[j] = scheme + p
		}
		return strings.Join(out, ","), nil
	}
	var err error
	s := run.Servers
	backend := run.Spec.Backend
	if path == pathLock && backend == "mysql" {
		path = pathMySQL
	}
	switch {
	case path == pathMySQL:
		var cfg *mysql.Config
		if cfg, err = mysql.ParseDSN(s.MySQLDSN); err == nil {
			if cfg.Addr, err = one(cfg.Addr); err == nil {
				env["OVERSOLD_MYSQL_DSN"] = cfg.FormatDSN()
			}
		}
	case backend == "redis":
		if strings.Contains(s.RedisAddr, "://") || strings.Contains(s.RedisAddr, ",") {
			err = fmt.Errorf("cannot proxy redis address %q: one host:port only", s.RedisAddr)
			break
		}
		env["OVERSOLD_REDIS_ADDR"], err = one(s.RedisAddr)
	case backend == "redlock":
		env["OVERSOLD_REDLOCK_ADDRS"], err = list(s.RedlockAddrs)
	case backend == "zookeeper":
		env["OVERSOLD_ZK_SERVERS"], err = list(s.ZKServers)
	case backend == "etcd":
		env["OVERSOLD_ETCD_ENDPOINTS"], err = list(s.EtcdEndpoints)
	default:
		err = fmt.Errorf("backend %q has no lock server to proxy", backend)
	}
	if err != nil {
		ps.Close()
		return nil, err
	}
	return ps, nil
}
