package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// Server kinds, as --servers names them.
const (
	kindMySQL   = "mysql"
	kindRedis   = "redis"
	kindRedlock = "redlock"
	kindZK      = "zk"
	kindEtcd    = "etcd"
)

var serverKinds = []string{kindMySQL, kindRedis, kindRedlock, kindZK, kindEtcd}

// defaultTargetDSN is orderd's own default (docs/design.md): where the checker
// looks for MySQL when --target is given without mysql=.
const defaultTargetDSN = "root@tcp(127.0.0.1:3306)/oversold?parseTime=true"

// redlockNodes is how many independent Redis masters the lab starts for
// Redlock.
const redlockNodes = 3

// servers is the --servers flag: addresses by kind.
type servers map[string]string

func (s *servers) String() string {
	if s == nil || *s == nil {
		return ""
	}
	var items []string
	for _, k := range serverKinds {
		if v, ok := (*s)[k]; ok {
			items = append(items, k+"="+v)
		}
	}
	return strings.Join(items, ",")
}

// Set parses one --servers value. Items are split at commas that begin a
// known "kind=": a comma elsewhere (in a DSN, in a list of Redis addresses)
// stays in the value.
func (s *servers) Set(value string) error {
	if *s == nil {
		*s = servers{}
	}
	var kind string
	for _, piece := range strings.Split(value, ",") {
		k, v, ok := strings.Cut(piece, "=")
		k = strings.TrimSpace(k)
		if k == "zookeeper" {
			k = kindZK
		}
		if ok && slices.Contains(serverKinds, k) {
			kind = k
			(*s)[kind] = strings.TrimSpace(v)
			continue
		}
		if kind == "" {
			return fmt.Errorf("want kind=address items, kind one of %s; got %q", strings.Join(serverKinds, ", "), piece)
		}
		(*s)[kind] += "," + piece
	}
	for k, v := range *s {
		if v == "" {
			return fmt.Errorf("%s= has no address", k)
		}
	}
	return nil
}

// addrList splits a list item at ';' or ','.
func addrList(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ';' || r == ',' || r == ' ' })
}

// kindOf is the server a lock backend needs beyond MySQL and Redis, or "".
func kindOf(backend string) string {
	switch backend {
	case "redlock":
		return kindRedlock
	case "zookeeper":
		return kindZK
	case "etcd":
		return kindEtcd
	}
	return ""
}

// testbedKind is the testbed server kind behind a --servers kind.
var testbedKind = map[string]string{
	kindMySQL: testbed.KindMariaDB, kindRedis: testbed.KindRedis, kindRedlock: testbed.KindRedis,
	kindZK: testbed.KindZooKeeper, kindEtcd: testbed.KindEtcd,
}

// fleetServers is every server the lab uses: the given ones, and the ones it
// started for the kinds not given.
type fleetServers struct {
	addrs    loadtest.Servers
	started  map[string][]*testbed.Server // by kind: what faults stop, pause and restart
	clusters []*testbed.Cluster           // with --topology cluster
	missing  map[string]error             // kind -> why it is not available
}

// startServers starts, at once, a private server for every kind in need that
// was not given. MySQL and Redis are needed by every run: failing either is
// fatal. Any other kind that fails only fails the runs that need it.
func startServers(ctx context.Context, need []string, given servers, topology string, keep bool) (*fleetServers, error) {
	fs := &fleetServers{started: map[string][]*testbed.Server{}, missing: map[string]error{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	set := func(kind string, addrs []string, srvs []*testbed.Server, err error) {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range srvs {
			if s != nil {
				fs.started[kind] = append(fs.started[kind], s)
			}
		}
		if err != nil {
			fs.missing[kind] = err
			return
		}
		switch kind {
		case kindMySQL:
			fs.addrs.MySQLDSN = addrs[0]
		case kindRedis:
			fs.addrs.RedisAddr = addrs[0]
		case kindRedlock:
			fs.addrs.RedlockAddrs = addrs
		case kindZK:
			fs.addrs.ZKServers = addrs
		case kindEtcd:
			fs.addrs.EtcdEndpoints = addrs
		}
	}
	for _, kind := range need {
		if v, ok := given[kind]; ok {
			if kind == kindMySQL || kind == kindRedis {
				set(kind, []string{v}, nil, nil)
			} else {
				set(kind, addrList(v), nil, nil)
			}
			continue
		}
		tk := testbedKind[kind]
		if cmd := testbed.Missing(tk); cmd != "" {
			set(kind, nil, nil, fmt.Errorf("%s is not installed: %s (or give it with --servers %s=...)", tk, cmd, kind))
			continue
		}
		if clustered(topology, kind) {
			wg.Go(func() {
				addrs, c, err := startCluster(ctx, kind, keep)
				var nodes []*testbed.Server
				if c != nil {
					nodes = c.Nodes
					mu.Lock()
					fs.clusters = append(fs.clusters, c)
					mu.Unlock()
				}
				set(kind, addrs, nodes, err)
			})
			continue
		}
		n := 1
		if kind == kindRedlock {
			n = redlockNodes
		}
		wg.Go(func() {
			srvs := make([]*testbed.Server, n)
			errs := make([]error, n)
			var inner sync.WaitGroup
			for i := range n {
				inner.Go(func() { srvs[i], errs[i] = startOne(ctx, tk, testbed.Options{Detach: keep}) })
			}
			inner.Wait()
			addrs := make([]string, 0, n)
			for _, s := range srvs {
				if s != nil {
					addr := s.Addr
					if kind == kindMySQL {
						addr = s.DSN("oversold")
					}
					addrs = append(addrs, addr)
				}
			}
			set(kind, addrs, srvs, errors.Join(errs...))
		})
	}
	wg.Wait()
	for _, kind := range []string{kindMySQL, kindRedis} {
		if err := fs.missing[kind]; err != nil && slices.Contains(need, kind) {
			fs.stop(keep)
			return nil, fmt.Errorf("%s: %w", kind, err)
		}
	}
	return fs, nil
}

func startOne(ctx context.Context, kind string, o testbed.Options) (*testbed.Server, error) {
	switch kind {
	case testbed.KindMariaDB:
		return testbed.StartMariaDB(ctx, o)
	case testbed.KindRedis:
		return testbed.StartRedis(ctx, o)
	case testbed.KindZooKeeper:
		return testbed.StartZooKeeper(ctx, o)
	case testbed.KindEtcd:
		return testbed.StartEtcd(ctx, o)
	}
	return nil, fmt.Errorf("no server kind %q", kind)
}

// unavailable says why backend cannot run here, or nil. A nil fleetServers
// (the lab started none) has nothing to say.
func (fs *fleetServers) unavailable(backend string) error {
	if fs == nil {
		return nil
	}
	if k := kindOf(backend); k != "" {
		if err := fs.missing[k]; err != nil {
			return fmt.Errorf("%s server: %w", k, err)
		}
	}
	return nil
}

// stop stops the servers the lab started, unless they are to be kept.
func (fs *fleetServers) stop(keep bool) {
	if keep {
		return
	}
	var wg sync.WaitGroup
	for _, srvs := range fs.started {
		for _, s := range srvs {
			wg.Go(func() { s.Stop() })
		}
	}
	wg.Wait()
	for _, c := range fs.clusters {
		c.Stop() // its nodes are stopped: this removes its folder
	}
}

// describe writes the addresses as a --servers value that reuses them.
func (fs *fleetServers) describe(w io.Writer) {
	a := fs.addrs
	items := []string{kindMySQL + "=" + a.MySQLDSN, kindRedis + "=" + a.RedisAddr}
	for kind, list := range map[string][]string{kindRedlock: a.RedlockAddrs, kindZK: a.ZKServers, kindEtcd: a.EtcdEndpoints} {
		if len(list) > 0 {
			items = append(items, kind+"="+strings.Join(list, ";"))
		}
	}
	slices.Sort(items[2:])
	fmt.Fprintf(w, "servers kept running; reuse them with:\n  --servers '%s'\n", strings.Join(items, ","))
	for _, kind := range serverKinds {
		for _, s := range fs.started[kind] {
			fmt.Fprintf(w, "  %s pid %d, dir %s\n", s, s.Pid(), s.Dir)
		}
	}
}
