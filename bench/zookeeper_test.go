package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
)

// zkRoot is where the peer's lock nodes go; ours keeps to its own root.
const zkRoot = "/oversold-bench"

func BenchmarkZooKeeper(b *testing.B) {
	servers := testbed.ZooKeeper(b)
	runServer(b, "zookeeper", zkVersion(servers[0]), []impl{
		ours("zookeeper", backends.Config{ZKServers: servers},
			"watches its predecessor (ephemeral sequential nodes, protected create); renews, fences with the granting listing's pzxid; a grant costs no request of its own"),
		zkLock(servers),
	})
}

// zkLock is the peer: github.com/go-zookeeper/zk's Lock.
func zkLock(servers []string) impl {
	return impl{
		name: "go-zookeeper",
		wait: "zk.Lock: watches its predecessor; it takes no ctx, so the wait is bounded by closing its connection",
		open: func(ctx context.Context) (*contender, error) {
			// Session timeout = the common TTL, as ours asks for.
			conn, _, err := zk.Connect(servers, ttl, zk.WithLogger(quiet{}))
			if err != nil {
				return nil, err
			}
			acl := zk.WorldACL(zk.PermAll)
			return &contender{
				lock: func(ctx context.Context, key string) (unlockFunc, error) {
					l := zk.NewLock(conn, zkRoot+"/"+key, acl)
					if err := bounded(ctx, conn, l.Lock); err != nil {
						return nil, err
					}
					return func(ctx context.Context) error { return bounded(ctx, conn, l.Unlock) }, nil
				},
				close: func() error { conn.Close(); return nil },
			}, nil
		},
	}
}

// bounded runs f, a go-zookeeper call without a ctx, and closes conn if ctx
// ends first: that is the only way to stop a zk.Lock wait, and it leaves the
// contender broken, so the benchmark fails rather than hangs.
func bounded(ctx context.Context, conn *zk.Conn, f func() error) error {
	stop := context.AfterFunc(ctx, conn.Close)
	err := f()
	if !stop() {
		return fmt.Errorf("zookeeper: %w (connection closed)", context.Cause(ctx))
	}
	return err
}

// quiet drops go-zookeeper's log lines: printed while a benchmark runs, they
// would split its result line.
type quiet struct{}

func (quiet) Printf(string, ...any) {}

// zkVersion asks the server with the srvr four-letter word.
func zkVersion(addr string) string {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "ZooKeeper (unknown version)"
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "srvr")
	out, _ := io.ReadAll(c)
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "Zookeeper version: "); ok {
			v, _, _ = strings.Cut(v, "-") // drop the build hash and date
			return "ZooKeeper " + strings.TrimSpace(v)
		}
	}
	return "ZooKeeper (unknown version)"
}
