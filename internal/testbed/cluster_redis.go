package testbed

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/clock"
)

// RedisClusterNodeTimeout is the Redis Cluster's cluster-node-timeout: a
// master unreachable this long is failed over to its replica.
const RedisClusterNodeTimeout = time.Second

// redisBusOffset is where a Redis Cluster node's bus port is: its own port
// plus this (Redis's default).
const redisBusOffset = 10000

// StartRedisCluster starts a Redis Cluster of three masters, each with one
// replica (nodes 0-2 are the masters, node 3+i replicates node i, until a
// failover changes that), on free loopback ports, without persistence as
// StartRedis, and returns once all 16384 slots are served and every replica
// is in sync with its master. A failover takes about
// RedisClusterNodeTimeout; replicas fail over whatever their lag
// (cluster-replica-validity-factor 0), as a failover that loses writes
// needs.
func StartRedisCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	return retryPorts(ctx, o, func(ctx context.Context) (*Cluster, error) { return startRedisCluster(ctx, o) })
}

func startRedisCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	const masters, n = 3, 6
	c, ports, err := newCluster(KindRedis, o, n, 1)
	if err != nil {
		return nil, err
	}
	c.leader = func(ctx context.Context, c *Cluster) (int, error) { return c.MasterOf(ctx, 0) }
	ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	err = c.startNodes(ctx, n, func(ctx context.Context, i int) (*Server, error) {
		args := []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", // in Dir: a restarted node rejoins as itself
			"--cluster-node-timeout", strconv.FormatInt(RedisClusterNodeTimeout.Milliseconds(), 10),
			"--cluster-replica-validity-factor", "0",
			"--repl-diskless-sync", "yes",
			"--repl-diskless-sync-delay", "0",
		}
		if c.Clients != nil {
			// The proxy is the node's address for clients (CLUSTER SLOTS,
			// MOVED) and, as Redis Cluster has one address per node, for
			// its replicas too; the bus stays on the node's own port+10000.
			_, port, _ := net.SplitHostPort(c.Clients[i].Addr())
			args = append(args, "--cluster-announce-ip", "127.0.0.1", "--cluster-announce-port", port,
				"--cluster-announce-bus-port", strconv.Itoa(ports[i][0]+redisBusOffset))
		}
		return StartRedis(ctx, Options{Dir: c.nodeDir(i), Port: ports[i][0], Detach: o.Detach, Args: append(args, o.Args...)})
	})
	if err != nil {
		return nil, err
	}
	if err := c.formRedisCluster(ctx, masters); err != nil {
		c.Stop()
		return nil, fmt.Errorf("start redis cluster: %w", err)
	}
	return c, nil
}

// formRedisCluster splits the slots among the masters, introduces every
// node to the first, makes the rest replicas, and waits until the cluster
// is whole: what redis-cli --cluster create does, without its prompts.
func (c *Cluster) formRedisCluster(ctx context.Context, masters int) error {
	clients := make([]*redis.Client, len(c.Nodes))
	for i, s := range c.Nodes {
		clients[i] = nodeClient(s.Addr)
		defer clients[i].Close()
	}
	ids := make([]string, len(c.Nodes))
	for i, cl := range clients {
		id, err := cl.Do(ctx, "cluster", "myid").Text()
		if err != nil {
			return err
		}
		ids[i] = id
	}
	for i := range masters {
		first, last := i*16384/masters, (i+1)*16384/masters-1
		if err := clients[i].Do(ctx, "cluster", "addslotsrange", first, last).Err(); err != nil {
			return fmt.Errorf("addslotsrange on %s: %w", c.Nodes[i].Addr, err)
		}
	}
	addrs := c.Addrs()
	for i, s := range c.Nodes[1:] {
		host, port, _ := net.SplitHostPort(addrs[i+1]) // as the node announces itself
		_, own, _ := net.SplitHostPort(s.Addr)
		bus, _ := strconv.Atoi(own)
		if err := clients[0].Do(ctx, "cluster", "meet", host, port, bus+redisBusOffset).Err(); err != nil {
			return err
		}
	}
	// A replica can only follow a master it knows.
	for i := masters; i < len(c.Nodes); i++ {
		for {
			err := clients[i].Do(ctx, "cluster", "replicate", ids[i-masters]).Err()
			if err == nil {
				break
			}
			if err := sleepOr(ctx, 50*time.Millisecond, err); err != nil {
				return fmt.Errorf("replicate %s to %s: %w", c.Nodes[i].Addr, c.Nodes[i-masters].Addr, err)
			}
		}
	}
	for i, cl := range clients {
		for {
			err := redisNodeWhole(ctx, cl, i >= masters, len(c.Nodes))
			if err == nil {
				break
			}
			if err := sleepOr(ctx, 50*time.Millisecond, err); err != nil {
				return fmt.Errorf("redis cluster node %s: %w", c.Nodes[i].Addr, err)
			}
		}
	}
	return nil
}

// redisNodeWhole is nil once the node sees the whole cluster up and, for a
// replica, its link to the master up and the first sync done.
func redisNodeWhole(ctx context.Context, cl *redis.Client, replica bool, nodes int) error {
	info, err := cl.ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	for _, want := range []string{"cluster_state:ok", "cluster_slots_ok:16384", "cluster_known_nodes:" + strconv.Itoa(nodes)} {
		if !strings.Contains(info, want+"\r\n") {
			return fmt.Errorf("cluster info lacks %s", want)
		}
	}
	if !replica {
		return nil
	}
	repl, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if !strings.Contains(repl, "master_link_status:up") || strings.Contains(repl, "master_sync_in_progress:1") {
		return fmt.Errorf("replica not in sync yet")
	}
	return nil
}

// sleepOr waits d; if ctx ends first, its error names the last failure.
func sleepOr(ctx context.Context, d time.Duration, last error) error {
	if err := clock.Sleep(ctx, d); err != nil {
		return fmt.Errorf("%w (last: %v)", err, last)
	}
	return nil
}

// nodeClient talks to one node only, failing fast.
func nodeClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1, PoolSize: 1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
}

// MasterOf returns the node that serves slot as master: of the running
// nodes that say they do (CLUSTER NODES, "myself,master" with the slot), the
// one with the highest config epoch, which the cluster converges on; a
// deposed master may still claim the slot until it hears of its successor.
func (c *Cluster) MasterOf(ctx context.Context, slot int) (int, error) {
	best, bestEpoch := -1, int64(-1)
	for i, s := range c.Nodes {
		if s.Pid() == 0 {
			continue
		}
		cl := nodeClient(s.Addr)
		nodes, err := cl.ClusterNodes(ctx).Result()
		cl.Close()
		if err != nil {
			continue
		}
		for _, l := range strings.Split(nodes, "\n") {
			f := strings.Fields(l)
			if len(f) < 8 || !strings.Contains(f[2], "myself") || !strings.Contains(f[2], "master") {
				continue
			}
			epoch, _ := strconv.ParseInt(f[6], 10, 64)
			if servesSlot(f[8:], slot) && epoch > bestEpoch {
				best, bestEpoch = i, epoch
			}
		}
	}
	if best < 0 {
		return -1, fmt.Errorf("redis cluster: no running node serves slot %d", slot)
	}
	return best, nil
}

// servesSlot reads CLUSTER NODES slot fields ("0-5460", "7", "[...]" for
// slots in migration).
func servesSlot(fields []string, slot int) bool {
	for _, f := range fields {
		if strings.HasPrefix(f, "[") {
			continue
		}
		lo, hi, found := strings.Cut(f, "-")
		if !found {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 == nil && err2 == nil && a <= slot && slot <= b {
			return true
		}
	}
	return false
}

// Role is "master" or "slave", as node i itself says (INFO replication).
func (c *Cluster) Role(ctx context.Context, i int) (string, error) {
	cl := nodeClient(c.Nodes[i].Addr)
	defer cl.Close()
	info, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(info, "\r\n") {
		if r, ok := strings.CutPrefix(l, "role:"); ok {
			return r, nil
		}
	}
	return "", fmt.Errorf("redis %s: no role in INFO replication", c.Nodes[i].Addr)
}

// ReplicasOf returns the nodes that replicate node i now.
func (c *Cluster) ReplicasOf(ctx context.Context, i int) ([]int, error) {
	var out []int
	host, port, _ := net.SplitHostPort(c.Addrs()[i]) // replicas dial the address it announces
	for j := range c.Nodes {
		if j == i || c.Nodes[j].Pid() == 0 {
			continue
		}
		cl := nodeClient(c.Nodes[j].Addr)
		info, err := cl.Info(ctx, "replication").Result()
		cl.Close()
		if err != nil {
			return nil, err
		}
		if strings.Contains(info, "role:slave\r\n") && strings.Contains(info, "master_host:"+host+"\r\n") &&
			strings.Contains(info, "master_port:"+port+"\r\n") {
			out = append(out, j)
		}
	}
	return out, nil
}

// KeySlot is the Cluster hash slot of key (CLUSTER KEYSLOT, asked of the
// first running node).
func (c *Cluster) KeySlot(ctx context.Context, key string) (int, error) {
	var last error
	for _, s := range c.Nodes {
		if s.Pid() == 0 {
			continue
		}
		cl := nodeClient(s.Addr)
		n, err := cl.ClusterKeySlot(ctx, key).Result()
		cl.Close()
		if err == nil {
			return int(n), nil
		}
		last = err
	}
	return -1, fmt.Errorf("redis cluster: keyslot %q: %v", key, last)
}

func (c *Cluster) index(addr string) int {
	for i, s := range c.Nodes {
		if s.Addr == addr {
			return i
		}
	}
	return -1
}
