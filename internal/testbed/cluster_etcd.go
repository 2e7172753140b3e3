package testbed

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"
)

// StartEtcdCluster starts a three-member etcd cluster (n1, n2, n3) on free
// loopback ports and returns once every member reports health, which
// needs a leader. With ClientProxies each member advertises its proxy as
// its client URL. A member killed and restarted keeps its data directory
// and rejoins as itself.
func StartEtcdCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	return retryPorts(ctx, o, func(ctx context.Context) (*Cluster, error) { return startEtcdCluster(ctx, o) })
}

func startEtcdCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	const n = 3
	c, ports, err := newCluster(KindEtcd, o, n, 2) // client, peer
	if err != nil {
		return nil, err
	}
	c.leader = etcdLeader
	peerURL := func(i int) string { return fmt.Sprintf("http://127.0.0.1:%d", ports[i][1]) }
	var initial []string
	for i := range n {
		initial = append(initial, fmt.Sprintf("n%d=%s", i+1, peerURL(i)))
	}
	token := "testbed-" + randHex()
	ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	err = c.startNodes(ctx, n, func(ctx context.Context, i int) (*Server, error) {
		return start(ctx, spec{
			kind:   KindEtcd,
			nports: 1,
			setup:  func(context.Context, *Server) error { return nil },
			argv: func(s *Server) []string {
				client, advertise := "http://"+s.Addr, "http://"+s.Addr
				if c.Clients != nil {
					advertise = "http://" + c.Clients[i].Addr()
				}
				return []string{
					mustPath("etcd"),
					fmt.Sprintf("--name=n%d", i+1),
					"--data-dir=" + filepath.Join(s.Dir, "data"),
					"--listen-client-urls=" + client,
					"--advertise-client-urls=" + advertise,
					"--listen-peer-urls=" + peerURL(i),
					"--initial-advertise-peer-urls=" + peerURL(i),
					"--initial-cluster=" + strings.Join(initial, ","),
					"--initial-cluster-token=" + token,
					"--initial-cluster-state=new", // ignored once data-dir holds a member
					"--heartbeat-interval=50",
					"--election-timeout=500",
					"--logger=zap",
					"--log-outputs=stderr",
				}
			},
			ready: pingEtcd,
		}, Options{Dir: c.nodeDir(i), Port: ports[i][0], Detach: o.Detach})
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// etcdLeader reads etcd_server_is_leader from every running member's
// /metrics.
func etcdLeader(ctx context.Context, c *Cluster) (int, error) {
	for i, s := range c.Nodes {
		if s.Pid() == 0 {
			continue
		}
		nctx, cancel := context.WithTimeout(ctx, time.Second) // a paused member never answers
		leads, err := etcdIsLeader(nctx, s.Addr)
		cancel()
		if err == nil && leads {
			return i, nil
		}
	}
	return -1, fmt.Errorf("etcd cluster: no member says it leads")
}

func etcdIsLeader(ctx context.Context, addr string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return false, err
	}
	resp, err := healthClient.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "etcd_server_is_leader "); ok {
			return strings.TrimSpace(v) == "1", nil
		}
	}
	return false, fmt.Errorf("etcd %s: no etcd_server_is_leader in /metrics", addr)
}
