package protected_test

import (
	"context"
	"testing"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/zklock/internal/zklocktest"
)

// config is the suite's, shared with the recipe's tests.
type config = zklocktest.Config

// open is the hardened composition orderd and the lab run: the recipe with
// this package's create, the shared watchdog, handover and the identity.
func open(ctx context.Context, c config) (locking.Locker, error) {
	return backends.Open(ctx, "zookeeper", backends.Config{ZKServers: c.Servers, TTL: c.TTL})
}

func TestMain(m *testing.M) { locktest.Main(m, open) }

// The suite on the composition backends.Open makes, on one server and on
// a three-node ensemble.
func TestConformance(t *testing.T)         { conformance(t, testbed.ZooKeeper(t)) }
func TestConformanceEnsemble(t *testing.T) { conformance(t, testbed.ZooKeeperEnsemble(t)) }

func conformance(t *testing.T, servers []string) { locktest.Run(t, zklocktest.Backend(servers)) }

// ttl is the suite's session timeout.
const ttl = zklocktest.TTL

var (
	parent      = zklocktest.Parent
	children    = zklocktest.Children
	queueLength = zklocktest.QueueLength
	withConn    = zklocktest.WithConn
	eventually  = zklocktest.Eventually
)
