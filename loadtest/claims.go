package loadtest

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// The seeds' claims, measured side by side: per lock backend on
// its cluster, whether the lock survives its leader's or master's failure,
// its handoff latency, and for Redis Cluster the pub/sub messages each node
// receives. Every figure comes from the runs of the report.

// clusterFailure names, per backend that runs on a cluster, the scenario
// that fails its leader or master under a held lease.
var clusterFailure = map[string]string{
	"redis":     "redis-cluster-failover",
	"zookeeper": "zk-leader-kill",
	"etcd":      "etcd-leader-kill",
}

// clusterName says what each backend's cluster is.
var clusterName = map[string]string{
	"redis":     "redis, Redis Cluster of 3 masters + 3 replicas",
	"zookeeper": "zookeeper, 3-node ensemble",
	"etcd":      "etcd, 3 members",
}

// ClaimHeads names ClaimRow's cells.
var ClaimHeads = []string{"backend, on its cluster", "survives leader / master failure", "handoff p50 / p99", "pub/sub: bus messages per node"}

// ClaimRow is one backend's line of the claims table.
type ClaimRow struct {
	Backend string
	Cells   []string
}

// ClaimRows builds the claims table from results: a row per backend that
// ran on a cluster (its failure scenario, or a cluster run without a
// fault), in the order redis, zookeeper, etcd. Nil when none did.
func ClaimRows(results []Result) []ClaimRow {
	var rows []ClaimRow
	for _, b := range []string{"redis", "zookeeper", "etcd"} {
		var failures, plain, single []Result
		for _, r := range results {
			if r.Backend != b || r.NotApplicable || r.Error != "" {
				continue
			}
			switch {
			case r.Fault == clusterFailure[b]:
				failures = append(failures, r)
			case r.Fault == "" && r.Topology == "cluster" && r.Workload == "":
				plain = append(plain, r)
			case r.Fault == "" && r.Topology == "" && r.Workload == "":
				single = append(single, r)
			}
		}
		if len(failures) == 0 && len(plain) == 0 {
			continue
		}
		rows = append(rows, ClaimRow{Backend: b, Cells: []string{
			clusterName[b], survives(clusterFailure[b], failures), handoff(plain, single), pubsubCell(b, plain),
		}})
	}
	return rows
}

// survives tells the failure scenario's runs, guard by guard: under guard
// none, whether two replicas held the lock at once (the lease records
// overlap) and whether an invariant broke; under the others, safe or not.
func survives(fault string, runs []Result) string {
	if len(runs) == 0 {
		return "not run (" + fault + ")"
	}
	var parts []string
	verdict := ""
	for _, g := range []string{"none", "fencing", "version", "atomic"} {
		var n, fired, safe, overlap int
		for _, r := range runs {
			if r.Guard != g {
				continue
			}
			n++
			if !r.NotFired {
				fired++
			}
			if r.Safe {
				safe++
			}
			if r.Overlaps > 0 {
				overlap++
			}
		}
		if n == 0 {
			continue
		}
		if g != "none" {
			parts = append(parts, fmt.Sprintf("guard %s safe %d/%d", g, safe, n))
			continue
		}
		switch {
		case overlap > 0 || safe < n:
			verdict = "no"
		case fired < n:
			verdict = "yes where it fired"
		default:
			verdict = "yes"
		}
		parts = append(parts, fmt.Sprintf("guard none: lease overlap in %d of %d runs, unsafe in %d, fired %d/%d", overlap, n, n-safe, fired, n))
	}
	text := fault + ": " + strings.Join(parts, "; ")
	if verdict != "" {
		text = verdict + ", " + text
	}
	return text
}

// handoff is the median over runs of each run's handoff p50 and p99, on the
// cluster and, where the report has them, on a single server.
func handoff(cluster, single []Result) string {
	med := func(runs []Result) (string, bool) {
		var p50, p99 []float64
		for _, r := range runs {
			if r.HandoffMS != nil {
				p50, p99 = append(p50, r.HandoffMS.P50), append(p99, r.HandoffMS.P99)
			}
		}
		if len(p50) == 0 {
			return "", false
		}
		s := fmt.Sprintf("%s / %s ms", num(median(p50)), num(median(p99)))
		if len(p50) > 1 {
			s += fmt.Sprintf(" (median of %d runs)", len(p50))
		}
		return s, true
	}
	c, ok := med(cluster)
	if !ok {
		return "-"
	}
	if s, ok := med(single); ok {
		c += "; single server: " + s
	}
	return c
}

// median of values, which it sorts in place.
func median(v []float64) float64 {
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// pubsubCell sums up the runs' PubSub: per figure, each run's node values
// from the highest down, averaged rank by rank over the runs, then grouped
// ("1.00 on 5 nodes, 0 on 1"); one line per figure.
func pubsubCell(backend string, runs []Result) string {
	if backend != "redis" {
		return "none: the lock waits on watches, no pub/sub"
	}
	var measured []*PubSub
	releases := 0
	for _, r := range runs {
		if r.PubSub != nil && len(r.PubSub.Nodes) > 0 {
			measured = append(measured, r.PubSub)
			releases += r.PubSub.Releases
		}
	}
	if len(measured) == 0 {
		return "not measured"
	}
	figure := func(get func(PubSubNode) float64) string {
		var sum []float64
		for _, ps := range measured {
			vals := make([]float64, len(ps.Nodes))
			for i, n := range ps.Nodes {
				vals[i] = get(n)
			}
			slices.Sort(vals)
			slices.Reverse(vals)
			for i, v := range vals {
				if i == len(sum) {
					sum = append(sum, 0)
				}
				sum[i] += v
			}
		}
		var groups []string
		for i := 0; i < len(sum); {
			v := num(sum[i] / float64(len(measured)))
			j := i
			for j < len(sum) && num(sum[j]/float64(len(measured))) == v {
				j++
			}
			nodes := "nodes"
			if j-i == 1 {
				nodes = "node"
			}
			groups = append(groups, fmt.Sprintf("%s on %d %s", v, j-i, nodes))
			i = j
		}
		return strings.Join(groups, ", ")
	}
	plural := "runs"
	if len(measured) == 1 {
		plural = "run"
	}
	return fmt.Sprintf("PUBLISH, per message: %s;\nSPUBLISH, per message: %s;\nthe lock's own wake-ups, per release (%d releases in %d %s): %s by PUBLISH, %s by SPUBLISH",
		figure(func(n PubSubNode) float64 { return n.Publish }),
		figure(func(n PubSubNode) float64 { return n.SPublish }),
		releases, len(measured), plural,
		figure(func(n PubSubNode) float64 { return n.LockPublish }),
		figure(func(n PubSubNode) float64 { return n.LockSPublish }))
}

// claimsSource says where the claims table's figures come from.
const claimsSource = `Where the figures come from: this report's runs. Survives: the runs of the scenario named, which kills the leader (ZooKeeper, etcd) or fails the lock slot's master over with its replication cut (Redis Cluster) while a replica holds the lease; "lease overlap" is two replicas' lease records on one key overlapping in time, "unsafe" an invariant broken. Handoff: the runs without a fault, each run's p50 and p99 of the gap from a lease's end to another replica's grant, the median over runs. Pub/sub: measured by the lab on the run's own Redis Cluster from each node's CLUSTER INFO counters (cluster_stats_messages_publish_received, ..._publishshard_received): the lock's wake-ups are the messages each node received during the run divided by the leases released; PUBLISH and SPUBLISH are a probe of 50 messages each, sent after the run from the master of the probe channel's slot (the sender counts none: it delivers to its own subscribers without the bus).`

// writeClaimsMarkdown writes the claims table to results.md, if any.
func writeClaimsMarkdown(w io.Writer, results []Result) {
	rows := ClaimRows(results)
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## On clusters: the seeds' claims\n\n| %s |\n|%s\n", strings.Join(ClaimHeads, " | "), strings.Repeat("---|", len(ClaimHeads)))
	for _, r := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.ReplaceAll(strings.Join(r.Cells, " | "), "\n", " "))
	}
	fmt.Fprintf(w, "\n%s\n", claimsSource)
}
