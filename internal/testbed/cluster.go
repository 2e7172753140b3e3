package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Cluster is several servers of one kind that agree among themselves: a
// ZooKeeper ensemble, an etcd cluster, a Redis Cluster. Each node is a
// Server of its own, so a fault kills, pauses or restarts one node with the
// Server methods; Leader finds the node to strike.
type Cluster struct {
	Kind  string    // KindZooKeeper, KindEtcd, KindRedis
	Nodes []*Server // in the order of their ids (ZooKeeper myid 1, 2, 3)
	Dir   string    // holds one directory per node
	// Clients[i] stands between the clients and node i when the cluster
	// was started with ClientProxies (nil otherwise): Clients[i].Cut()
	// cuts node i off from its clients alone, Latency slows it for them,
	// Restore heals. Links between the nodes stay direct.
	Clients Proxies

	ownDir bool
	leader func(ctx context.Context, c *Cluster) (int, error)
}

// ClusterOptions tune a cluster start. The zero value is three nodes (six for
// Redis: three masters and a replica of each) in a fresh temp dir.
type ClusterOptions struct {
	Dir string // "" = a new temp dir, removed by Stop
	// Detach lets the nodes survive this process (lab --keep).
	Detach bool
	// Args are extra server arguments for every node, after testbed's own
	// (Redis only).
	Args []string
	// ClientProxies puts a proxy (Cluster.Clients) in front of each node's
	// client port, and makes the nodes announce it: a Redis Cluster node
	// gives the proxy's address in CLUSTER SLOTS, CLUSTER NODES and MOVED
	// (its bus port stays direct), an etcd member advertises it as its
	// client URL. Off by default: the proxies live in this process (no
	// Detach), and every byte through them costs this process CPU.
	ClientProxies bool
}

// Addrs are the addresses clients use, in node order: the nodes' own, or
// their proxies' with ClientProxies.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
		if c.Clients != nil {
			out[i] = c.Clients[i].Addr()
		}
	}
	return out
}

// Leader returns the index of the node that leads now (ZooKeeper, etcd),
// asking every running node; for Redis it is the master of slot 0 (see
// MasterOf for any other slot).
func (c *Cluster) Leader(ctx context.Context) (int, error) { return c.leader(ctx, c) }

// WaitLeader polls Leader until a node other than not (-1 for any) leads,
// and returns it with the time it took.
func (c *Cluster) WaitLeader(ctx context.Context, not int) (int, error) {
	for {
		i, err := c.Leader(ctx)
		if err == nil && i != not {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("%s cluster: no new leader: %w (last: %d, %v)", c.Kind, ctx.Err(), i, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop stops every node and removes Dir if testbed made it.
func (c *Cluster) Stop() error {
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Go(func() { errs[i] = n.Stop() })
	}
	wg.Wait()
	c.Clients.Close()
	if c.ownDir {
		errs = append(errs, os.RemoveAll(c.Dir))
	}
	return errors.Join(errs...)
}

// String names the cluster for logs.
func (c *Cluster) String() string {
	return fmt.Sprintf("%s cluster %s", c.Kind, strings.Join(c.Addrs(), ","))
}

// newCluster makes the cluster's directory, picks its ports (per node,
// perNode ports, the client port first) and starts its client proxies.
func newCluster(kind string, o ClusterOptions, nodes, perNode int) (*Cluster, [][]int, error) {
	if cmd := Missing(kind); cmd != "" {
		return nil, nil, fmt.Errorf("start %s cluster: %w: %s", kind, ErrMissing, cmd)
	}
	if o.ClientProxies && o.Detach {
		return nil, nil, fmt.Errorf("start %s cluster: client proxies live in this process: they cannot outlive it (Detach)", kind)
	}
	c := &Cluster{Kind: kind, Dir: o.Dir}
	if c.Dir == "" {
		d, err := os.MkdirTemp("", "testbed-"+kind+"-cluster-")
		if err != nil {
			return nil, nil, err
		}
		c.Dir, c.ownDir = d, true
	}
	if d, err := filepath.Abs(c.Dir); err == nil {
		c.Dir = d
	}
	ports := make([][]int, nodes)
	for i := range ports {
		p, err := freePorts(perNode, 0)
		if err != nil {
			c.Stop()
			return nil, nil, err
		}
		ports[i] = p
	}
	if o.ClientProxies {
		// Listening ports from freePorts too: one picked at random could be
		// a node's, picked but not bound yet.
		listen, err := freePorts(nodes, 0)
		if err != nil {
			c.Stop()
			return nil, nil, err
		}
		for i := range nodes {
			p, err := startProxy(fmt.Sprintf("%s%d-clients", kind, i+1), "127.0.0.1:"+strconv.Itoa(listen[i]), "127.0.0.1:"+strconv.Itoa(ports[i][0]))
			if err != nil {
				c.Stop()
				return nil, nil, err
			}
			c.Clients = append(c.Clients, p)
		}
	}
	return c, ports, nil
}

// startNodes starts every node at once (no node of a quorum can be ready
// alone) and stops them all if one fails.
func (c *Cluster) startNodes(ctx context.Context, n int, start func(ctx context.Context, i int) (*Server, error)) error {
	c.Nodes = make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { c.Nodes[i], errs[i] = start(ctx, i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		var started []*Server
		for _, s := range c.Nodes {
			if s != nil {
				started = append(started, s)
			}
		}
		c.Nodes = started
		c.Stop()
		return fmt.Errorf("start %s cluster: %w", c.Kind, err)
	}
	return nil
}

func (c *Cluster) nodeDir(i int) string { return filepath.Join(c.Dir, "node"+strconv.Itoa(i+1)) }

// retryPorts starts a cluster again, on fresh ports, when another process
// took one of the ports picked for it before its node could bind it (all
// are picked up front: each node's config names the others'). Only in a
// directory of its own: a half-made one would be reused.
func retryPorts(ctx context.Context, o ClusterOptions, start func(context.Context) (*Cluster, error)) (*Cluster, error) {
	for attempt := 1; ; attempt++ {
		c, err := start(ctx)
		if err == nil || o.Dir != "" || attempt == portAttempts || !errors.Is(err, errPortTaken) || ctx.Err() != nil {
			return c, err
		}
	}
}

// clusterTimeout bounds a whole cluster start: its nodes start at once, and
// a Redis Cluster then forms.
const clusterTimeout = 2 * startTimeout

// lazyCluster is a cluster one test binary starts at most once.
type lazyCluster struct {
	mu  sync.Mutex
	c   *Cluster
	err error
	ran bool
}

var sharedClusters = map[string]*lazyCluster{KindZooKeeper: {}, KindEtcd: {}, KindRedis: {}}

func sharedCluster(t testing.TB, kind string, start func(context.Context) (*Cluster, error)) *Cluster {
	t.Helper()
	needBinary(t, kind)
	l := sharedClusters[kind]
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ran {
		l.ran = true
		// Not t.Context(): the cluster outlives this test.
		ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
		l.c, l.err = start(ctx)
		cancel()
	}
	if l.err != nil {
		t.Fatalf("testbed: shared %s cluster: %v", kind, l.err)
	}
	return l.c
}

// stopSharedClusters is StopShared's part for clusters.
func stopSharedClusters() {
	for _, l := range sharedClusters {
		l.mu.Lock()
		if l.c != nil {
			l.c.Stop()
		}
		l.c, l.err, l.ran = nil, nil, false
		l.mu.Unlock()
	}
}

// ZooKeeperEnsemble returns the client addresses of the test binary's
// shared three-node ZooKeeper ensemble.
func ZooKeeperEnsemble(t testing.TB) []string {
	t.Helper()
	return sharedCluster(t, KindZooKeeper, func(ctx context.Context) (*Cluster, error) {
		return StartZooKeeperEnsemble(ctx, ClusterOptions{}, nil)
	}).Addrs()
}

// EtcdCluster returns the client endpoints of the test binary's shared
// three-member etcd cluster.
func EtcdCluster(t testing.TB) []string {
	t.Helper()
	return sharedCluster(t, KindEtcd, func(ctx context.Context) (*Cluster, error) {
		return StartEtcdCluster(ctx, ClusterOptions{})
	}).Addrs()
}

// RedisCluster returns the addresses of the test binary's shared Redis
// Cluster (three masters, a replica each); keep to Prefix(t) keys.
func RedisCluster(t testing.TB) []string {
	t.Helper()
	return sharedCluster(t, KindRedis, func(ctx context.Context) (*Cluster, error) {
		return StartRedisCluster(ctx, ClusterOptions{})
	}).Addrs()
}
