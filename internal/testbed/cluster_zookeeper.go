package testbed

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// zkSyncLimit is how long, in 200 ms ticks, a follower may go without
// hearing from the leader before it gives up on it (and how long the leader
// waits for a follower): 5 s, longer than the lab's 2 s sessions, so a
// follower cut off from the quorum keeps answering its clients while the
// leader expires their sessions (the zk-follower-partition case).
const zkSyncLimit = 25

// StartZooKeeperEnsemble starts a three-node ZooKeeper ensemble (myid 1, 2,
// 3, one zoo.cfg each, as StartZooKeeper's 200 ms tick) on free loopback
// ports and returns once every node serves, which needs a leader. peer, if
// not nil, gives the port on 127.0.0.1 that node from dials to reach node
// to's peer port (quorum or election); it is called from the nodes' starts
// at once. A proxy there lets a fault cut one node off from the others
// while its clients still reach it.
func StartZooKeeperEnsemble(ctx context.Context, o ClusterOptions, peer func(from, to, port int) (int, error)) (*Cluster, error) {
	return retryPorts(ctx, o, func(ctx context.Context) (*Cluster, error) { return startZooKeeperEnsemble(ctx, o, peer) })
}

func startZooKeeperEnsemble(ctx context.Context, o ClusterOptions, peer func(from, to, port int) (int, error)) (*Cluster, error) {
	const n = 3
	c, ports, err := newCluster(KindZooKeeper, o, n, 3) // client, quorum, election
	if err != nil {
		return nil, err
	}
	c.leader = zkLeader
	ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	err = c.startNodes(ctx, n, func(ctx context.Context, i int) (*Server, error) {
		dir := c.nodeDir(i)
		if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "data", "myid"), []byte(strconv.Itoa(i+1)+"\n"), 0o644); err != nil {
			return nil, err
		}
		args := []string{
			"-Xmx128m",
			"-Dzookeeper.cnxTimeout=500", // election connections to a dead node give up fast
			// An election whose notifications went unanswered re-sends
			// them after a wait that doubles up to a minute by default:
			// a lost exchange on a loaded box then stalls it for tens of
			// seconds. Capped at a second, a lost one costs a second.
			"-Dzookeeper.fastleader.maxNotificationInterval=1000",
			"initLimit=50",
			"syncLimit=" + strconv.Itoa(zkSyncLimit),
		}
		for j := range n {
			q, e := ports[j][1], ports[j][2]
			if peer != nil && j != i {
				var err error
				if q, err = peer(i, j, q); err != nil {
					return nil, err
				}
				if e, err = peer(i, j, e); err != nil {
					return nil, err
				}
			}
			args = append(args, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", j+1, q, e))
		}
		return StartZooKeeper(ctx, Options{Dir: dir, Port: ports[i][0], Args: args, Detach: o.Detach})
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// zkLeader asks every running node for its mode (srvr); when none leads,
// the error says what each answered.
func zkLeader(ctx context.Context, c *Cluster) (int, error) {
	var said []string
	for i, s := range c.Nodes {
		if s.Pid() == 0 {
			said = append(said, fmt.Sprintf("node %d down", i+1))
			continue
		}
		nctx, cancel := context.WithTimeout(ctx, time.Second) // a paused node never answers
		mode, err := zkMode(nctx, s.Addr)
		cancel()
		if err == nil && mode == "leader" {
			return i, nil
		}
		if err != nil {
			mode = err.Error()
		}
		said = append(said, fmt.Sprintf("node %d %s", i+1, mode))
	}
	return -1, fmt.Errorf("zookeeper ensemble: no node says it leads (%s)", strings.Join(said, "; "))
}

// ZKMode is a ZooKeeper server's "Mode:" from srvr: "leader", "follower",
// "standalone", or an error when it does not serve.
func ZKMode(ctx context.Context, addr string) (string, error) { return zkMode(ctx, addr) }

func zkMode(ctx context.Context, addr string) (string, error) {
	out, err := ZKFourLetter(ctx, addr, "srvr")
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(out) {
		if m, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	return "", fmt.Errorf("zookeeper %s does not serve: srvr %q", addr, tailString(out, 3))
}

// ZKFourLetter sends a four-letter word (srvr, wchs, cons...) to the
// ZooKeeper server at addr and returns its answer.
func ZKFourLetter(ctx context.Context, addr, word string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, word); err != nil {
		return "", err
	}
	out, err := io.ReadAll(conn)
	return string(out), err
}
