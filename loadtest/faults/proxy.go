package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/oversold-lab/oversold/loadtest"
)

// proxy is an in-process toxiproxy TCP proxy on a free loopback port: the
// way to make one replica's path to a server slow or dead while the others
// keep theirs (etcd's robustness tests use an in-process proxy the same way).
type proxy struct {
	p     *toxiproxy.Proxy
	mu    sync.Mutex
	on    []string    // toxics in place, by name
	stuck atomic.Bool // a heal timed out (see heal)
}

// startProxy listens on 127.0.0.1 and forwards every connection to upstream
// (host:port).
func startProxy(name, upstream string) (*proxy, error) {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("proxy %s to %s: %w", name, upstream, err)
	}
	return &proxy{p: p}, nil
}

// Addr is where clients connect instead of the upstream.
func (p *proxy) Addr() string { return p.p.Listen }

// toxic adds a toxic ("latency", "timeout", ...) to one direction: stream
// "upstream" is client to server, "downstream" server to client. It applies
// to the connections already open as well as to new ones.
func (p *proxy) toxic(name, typ, stream string, attrs map[string]int64) error {
	body, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		return err
	}
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		return fmt.Errorf("proxy %s: toxic %s: %w", p.p.Name, name, err)
	}
	p.mu.Lock()
	p.on = append(p.on, name)
	p.mu.Unlock()
	return nil
}

// latency delays every chunk in both directions by d: a request and its
// reply each take d longer.
func (p *proxy) latency(d time.Duration) error {
	for _, s := range []string{"upstream", "downstream"} {
		if err := p.toxic("latency_"+s, "latency", s, map[string]int64{"latency": d.Milliseconds()}); err != nil {
			return err
		}
	}
	return nil
}

// blackhole drops everything in both directions and closes nothing: a
// partition as the client sees it (sends vanish, nothing comes back, until
// its own timeouts give up).
func (p *proxy) blackhole() error {
	for _, s := range []string{"upstream", "downstream"} {
		if err := p.toxic("timeout_"+s, "timeout", s, map[string]int64{"timeout": 0}); err != nil {
			return err
		}
	}
	return nil
}

// heal removes every toxic: delayed data flows at once, dropped data stays
// dropped (the client has given up on those connections by then).
func (p *proxy) heal() {
	p.mu.Lock()
	on := p.on
	p.on = nil
	p.mu.Unlock()
	for _, name := range on {
		// toxiproxy v2.5.0 can deadlock here: RemoveToxic waits for the
		// links while holding the collection's lock, which a link closing
		// at the same moment needs (seen once in ~70 zookeeper
		// slow-lock-server runs). Never let that hang the run: give up
		// after a while and leave that goroutine behind.
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = p.p.Toxics.RemoveToxic(context.Background(), name)
		}()
		select {
		case <-done:
		case <-time.After(healTimeout):
			p.stuck.Store(true)
			return
		}
	}
}

// healTimeout bounds the removal of one toxic (see heal).
const healTimeout = 5 * time.Second

// Close heals and stops the proxy, closing its connections. A proxy whose
// heal got stuck is left as it is: stopping it would block as well.
func (p *proxy) Close() {
	p.heal()
	if p.stuck.Load() {
		return
	}
	p.p.Stop()
}

// proxies is a group of proxies that fail together.
type proxies []*proxy

func (ps proxies) latency(d time.Duration) error {
	for _, p := range ps {
		if err := p.latency(d); err != nil {
			return err
		}
	}
	return nil
}

func (ps proxies) blackhole() error {
	for _, p := range ps {
		if err := p.blackhole(); err != nil {
			return err
		}
	}
	return nil
}

func (ps proxies) heal() {
	for _, p := range ps {
		p.heal()
	}
}

func (ps proxies) Close() {
	for _, p := range ps {
		p.Close()
	}
}

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
func proxyReplica(run *loadtest.Run, i int, path string) (proxies, error) {
	if run.ReplicaEnv[i] == nil {
		run.ReplicaEnv[i] = map[string]string{}
	}
	env := run.ReplicaEnv[i]
	var ps proxies
	one := func(addr string) (string, error) {
		p, err := startProxy(fmt.Sprintf("r%d-%s-%d", i+1, path, len(ps)), addr)
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
