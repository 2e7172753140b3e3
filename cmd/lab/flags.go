package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/oversold-lab/oversold/loadtest"
	"github.com/oversold-lab/oversold/loadtest/faults"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/storage"
)

// config is the lab's command line, validated.
type config struct {
	backends, guards []string // the matrix, or the default experiment when neither was given
	gates            []string // crossed with the matrix: "" (none) and/or "redis"
	accepts          []string // crossed with the matrix: "" (sync) and/or "queue"
	replicas         int
	stock            int
	requests         int
	rate             int
	workers          int
	workDelay        time.Duration
	skus             int
	lockTTL          time.Duration
	servers          servers // given by address; the rest are started
	topology         string  // "single" or "cluster": what the lab starts (docs/design.md)
	target           string  // replicas already running behind this URL
	orderd           string  // a prebuilt orderd; "" builds ./cmd/orderd
	keep             bool
	out              string
	json             bool
	seed             int64
	faults           []string // scenarios, each run on every backend and guard
	repeat           int      // runs of each configuration, seeds seed, seed+1, ...
	sweep            sweepConfig
	merge            []string // report folders to join into one report; nothing runs
	workload         string   // "orders" or "reservations" (docs/design.md, "The lab")
}

// usageError is a bad command line: exit status 2, one line naming the flag.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func badFlag(name, format string, args ...any) error {
	return usageError{fmt.Sprintf("--%s: %s", name, fmt.Sprintf(format, args...))}
}

const usageText = `Usage: lab [flags]

Runs the oversell experiment: private real servers, orderd replicas behind a
round-robin balancer, a fixed load on hot SKUs, then the invariants read from
MySQL. With no flags: every lock backend with guard none, and lock none with
guards version and atomic as references. Progress and the table go to
stderr; the report to --out.

Flags:
`

const serversHelp = `servers to use instead of starting them, as kind=address items
separated by commas (repeatable; lists inside an item separated by ';'):
  mysql=DSN            go-sql-driver DSN of the oversold database
  redis=host:port      stock cache and redis lock (any OVERSOLD_REDIS_ADDR form)
  redlock=h:p;h:p;h:p  independent Redis masters
  zk=h:p;...           ZooKeeper servers
  etcd=http://h:p;...  etcd endpoints
kinds not given are started privately when a run needs them`

func parseFlags(args []string, stderr io.Writer) (config, error) {
	c := config{}
	fs := flag.NewFlagSet("lab", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported in one line by the caller
	var backendList, guardList string
	fs.StringVar(&backendList, "backends", "", "comma-separated lock backends: none,"+strings.Join(backends.Names, ",")+
		"\n(default: all of them with guard none, plus none with guards version and atomic, plus one reservations run per backend)")
	fs.StringVar(&guardList, "guards", "", "comma-separated guards, crossed with --backends: "+strings.Join(guardNames(), ",")+" (default none)")
	var gateList, acceptList string
	fs.StringVar(&acceptList, "accept", "", "comma-separated accepts, crossed with --backends, --guards and --gates: sync,queue (default sync;\n"+
		"queue needs the gate: without --gates its runs take it; the default experiment adds none/atomic+gate+queue)")
	fs.StringVar(&gateList, "gates", "", "comma-separated stock gates, crossed with --backends and --guards: none,redis (default none;\n"+
		"the default experiment adds none/atomic and the peers' none/none with the gate)")
	c.replicas, c.skus = 3, 1
	fs.Var(intList{&c.replicas, &c.sweep.replicas}, "replicas", "orderd replicas behind the balancer; with --sweep a comma-separated list, 1,2,3,4 unless given")
	fs.IntVar(&c.stock, "stock", 100, "initial stock per SKU")
	fs.StringVar(&c.workload, "workload", "orders", "orders (direct orders) or reservations (checkouts: hold 1 to 3 SKUs of the hot set,\n"+
		"then confirm, cancel or abandon; --requests is the checkouts, --skus defaults to 4)")
	fs.IntVar(&c.requests, "requests", 600, "orders sent per run (more than the stock, so it runs out)")
	fs.IntVar(&c.rate, "rate", 1000, "orders per second offered; above what a lock sustains here, so req/s measures capacity")
	fs.IntVar(&c.workers, "workers", 64, "orders in flight at most")
	fs.DurationVar(&c.workDelay, "work-delay", 2*time.Millisecond, "simulated work inside the critical section (OVERSOLD_WORK_DELAY)")
	fs.Var(intList{&c.skus, &c.sweep.skus}, "skus", "hot SKUs, ordered round-robin; with --sweep a comma-separated list, 1,4,16 unless given")
	fs.DurationVar(&c.lockTTL, "lock-ttl", 2*time.Second, "lease time to live (OVERSOLD_LOCK_TTL)")
	fs.Var(&c.servers, "servers", serversHelp)
	fs.StringVar(&c.topology, "topology", topologySingle, "servers the lab starts: single (one of each) or cluster (a three-node\n"+
		"ZooKeeper ensemble, a three-node etcd cluster, a Redis Cluster of three masters with a replica each\n"+
		"for the cache and the redis lock; Redlock keeps its independent masters)")
	fs.StringVar(&c.target, "target", "", "base URL of replicas already running behind a balancer (the compose demo):\n"+
		"starts none and runs one configuration; the admin token comes from OVERSOLD_ADMIN_TOKEN")
	fs.StringVar(&c.orderd, "orderd", "", "orderd binary to run, built with -tags labfaults for the faults that use its hook (default: go build -tags labfaults ./cmd/orderd)")
	fs.BoolVar(&c.keep, "keep", false, "leave the started servers running and print their addresses")
	fs.StringVar(&c.out, "out", "lab-report", "report folder")
	fs.BoolVar(&c.json, "json", false, "print the results array on stdout, and nothing else there")
	fs.Int64Var(&c.seed, "seed", 1, "seed for the lab's random choices (fault timing)")
	var faultList string
	fs.StringVar(&faultList, "fault", "", "comma-separated fault scenarios: "+strings.Join(faultNames(), ",")+
		"\n(with a fault, --guards defaults to none,version,fencing and --backends to all)")
	fs.IntVar(&c.repeat, "repeat", 1, "runs of each configuration, with seeds --seed, --seed+1, ...")
	fs.BoolVar(&c.sweep.on, "sweep", false, sweepHelp)
	var mergeList string
	fs.StringVar(&mergeList, "merge", "", "comma-separated report folders of earlier labs (parallel lanes, other machines):\n"+
		"runs nothing, writes their results.json as one report to --out; only --out and --json go with it")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, usageText)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return c, err
		}
		return c, usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return c, usageError{fmt.Sprintf("unexpected argument %q (the lab takes flags only)", fs.Arg(0))}
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["merge"] {
		return c, c.checkMerge(mergeList, given)
	}

	var err error
	if c.backends, err = list("backends", backendList, given["backends"], append([]string{"none"}, backends.Names...)); err != nil {
		return c, err
	}
	if c.guards, err = list("guards", guardList, given["guards"], guardNames()); err != nil {
		return c, err
	}
	if c.faults, err = list("fault", faultList, given["fault"], faultNames()); err != nil {
		return c, err
	}
	gates, err := list("gates", gateList, given["gates"], []string{"none", "redis"})
	if err != nil {
		return c, err
	}
	for _, g := range gates {
		if g == "none" {
			g = "" // Spec.Gate's none
		}
		c.gates = append(c.gates, g)
	}
	accepts, err := list("accept", acceptList, given["accept"], []string{"sync", "queue"})
	if err != nil {
		return c, err
	}
	for _, a := range accepts {
		if a == "sync" {
			a = "" // Spec.Accept's sync
		}
		c.accepts = append(c.accepts, a)
	}
	if slices.Contains(c.accepts, "queue") && c.gates != nil && !slices.Contains(c.gates, "redis") {
		return c, badFlag("accept", "queue needs the stock gate, and --gates has no redis")
	}
	switch {
	case c.faults != nil && !given["guards"]:
		c.guards = []string{"none", "version", "fencing"}
		if !given["backends"] {
			c.backends = slices.Clone(backends.Names)
		}
	case c.faults != nil && !given["backends"]:
		c.backends = slices.Clone(backends.Names)
	case !given["backends"] && !given["guards"]:
		// the default experiment: see specs
	case !given["backends"]:
		c.backends = slices.Clone(backends.Names)
	case !given["guards"]:
		c.guards = []string{"none"}
	}

	for _, n := range []struct {
		name string
		v    int
		min  int
	}{{"replicas", c.replicas, 1}, {"stock", c.stock, 1}, {"requests", c.requests, 1},
		{"rate", c.rate, 1}, {"workers", c.workers, 1}, {"skus", c.skus, 1}, {"repeat", c.repeat, 1}} {
		if n.v < n.min {
			return c, badFlag(n.name, "must be at least %d, got %d", n.min, n.v)
		}
	}
	if c.replicas > 32 {
		return c, badFlag("replicas", "at most 32, got %d", c.replicas)
	}
	if c.workDelay < 0 {
		return c, badFlag("work-delay", "must not be negative, got %s", c.workDelay)
	}
	if c.lockTTL <= 0 {
		return c, badFlag("lock-ttl", "must be positive, got %s", c.lockTTL)
	}
	if c.out == "" {
		return c, badFlag("out", "must name a folder")
	}
	switch c.workload {
	case "orders":
	case loadtest.WorkloadReservations:
		if !given["skus"] {
			c.skus = defaultCheckoutSKUs
		}
	default:
		return c, badFlag("workload", "want orders or reservations, got %q", c.workload)
	}
	all := faults.All()
	for _, f := range c.faults {
		if w := all[f].Workload; w != c.specWorkload() {
			return c, badFlag("fault", "%s needs --workload %s", f, loadtest.WorkloadName(w))
		}
	}
	if c.topology != topologySingle && c.topology != topologyCluster {
		return c, badFlag("topology", "want single or cluster, got %q", c.topology)
	}
	if c.topology == topologyCluster && c.target != "" {
		return c, badFlag("topology", "the lab starts no server with --target")
	}
	if err := c.checkSweep(given); err != nil {
		return c, err
	}
	if c.target != "" {
		u, err := url.Parse(c.target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return c, badFlag("target", "want a base URL such as http://127.0.0.1:8080, got %q", c.target)
		}
		c.target = strings.TrimSuffix(c.target, "/")
		if len(c.backends) != 1 || len(c.guards) != 1 {
			return c, badFlag("target", "runs the one configuration the replicas have: give one --backends and one --guards")
		}
		if c.orderd != "" {
			return c, badFlag("orderd", "not used with --target, whose replicas already run")
		}
		if c.faults != nil {
			return c, badFlag("fault", "needs replicas the lab starts itself: not with --target")
		}
	}
	return c, nil
}

// checkMerge validates --merge: folders, and no flag that would run anything.
func (c *config) checkMerge(value string, given map[string]bool) error {
	for _, name := range slices.Sorted(maps.Keys(given)) {
		if name != "merge" && name != "out" && name != "json" {
			return badFlag("merge", "joins earlier reports and runs nothing: --%s does not go with it", name)
		}
	}
	if c.out == "" {
		return badFlag("out", "must name a folder")
	}
	for _, dir := range strings.Split(value, ",") {
		dir = strings.TrimSpace(dir)
		switch {
		case dir == "":
			return badFlag("merge", "empty item in %q", value)
		case filepath.Clean(dir) == filepath.Clean(c.out):
			return badFlag("out", "%q is one of the reports merged: its results.json would be overwritten", c.out)
		}
		c.merge = append(c.merge, dir)
	}
	return nil
}

// list splits a comma-separated flag value and checks each item.
func list(name, value string, given bool, known []string) ([]string, error) {
	if !given {
		return nil, nil
	}
	var out []string
	for _, item := range strings.Split(value, ",") {
		item = strings.TrimSpace(item)
		switch {
		case item == "":
			return nil, badFlag(name, "empty item in %q", value)
		case !slices.Contains(known, item):
			return nil, badFlag(name, "unknown %q (want %s)", item, strings.Join(known, ", "))
		case !slices.Contains(out, item):
			out = append(out, item)
		}
	}
	return out, nil
}

// faultNames lists the scenarios, sorted.
func faultNames() []string {
	names := slices.Collect(maps.Keys(faults.All()))
	slices.Sort(names)
	return names
}

func guardNames() []string {
	out := make([]string, len(storage.Guards))
	for i, g := range storage.Guards {
		out[i] = string(g)
	}
	return out
}

// specTopology is what the runs record: "cluster", or nothing for the
// default single servers.
func (c config) specTopology() string {
	if c.topology == topologyCluster {
		return topologyCluster
	}
	return ""
}

// specs is the experiment the flags ask for, in run order.
func (c config) specs() []loadtest.Spec {
	if c.sweep.on {
		return c.sweepSpecs()
	}
	type pair struct{ backend, guard, gate, accept string }
	var pairs []pair
	if c.defaultExperiment() {
		for _, b := range backends.Names {
			pairs = append(pairs, pair{b, "none", "", ""})
		}
		pairs = append(pairs, pair{"none", "version", "", ""}, pair{"none", "atomic", "", ""},
			// the stock gate: above MySQL's condition, and the peers'
			// design, which trusts it alone
			pair{"none", "atomic", "redis", ""}, pair{"none", "none", "redis", ""},
			// accept now, write later: the queue on the gate
			pair{"none", "atomic", "redis", "queue"})
	} else {
		bs, gs := c.backends, c.guards
		if bs == nil && gs == nil { // --gates or --accept alone: the references
			bs, gs = []string{"none"}, []string{"atomic", "none"}
		}
		for _, b := range bs {
			for _, g := range gs {
				for _, gate := range c.gateList() {
					for _, accept := range c.acceptList() {
						gate := gate
						if accept == "queue" && gate == "" {
							if c.gates != nil {
								continue // --gates none: the queue needs the gate
							}
							gate = "redis"
						}
						pairs = append(pairs, pair{b, g, gate, accept})
					}
				}
			}
		}
	}
	faults := c.faults
	if faults == nil {
		faults = []string{""}
	}
	var specs []loadtest.Spec
	for _, f := range faults {
		for _, p := range pairs {
			for i := range max(c.repeat, 1) {
				specs = append(specs, loadtest.Spec{
					Backend: p.backend, Guard: p.guard, Gate: p.gate, Accept: p.accept, Replicas: c.replicas, Fault: f,
					Stock: c.stock, SKUs: c.skus, Requests: c.requests, Rate: c.rate, Workers: c.workers,
					WorkDelay: c.workDelay, LockTTL: c.lockTTL, Seed: c.seed + int64(i), Topology: c.specTopology(),
					Workload: c.specWorkload(),
				})
			}
		}
	}
	if c.defaultExperiment() && c.specWorkload() == "" {
		// The default experiment also runs checkouts: one reservations
		// run per backend, guard none, small enough to keep the whole
		// default within a few minutes on 2 cores.
		for _, b := range backends.Names {
			for i := range max(c.repeat, 1) {
				specs = append(specs, loadtest.Spec{
					Backend: b, Guard: "none", Replicas: c.replicas,
					Stock: c.stock, SKUs: defaultCheckoutSKUs, Requests: defaultCheckouts, Rate: c.rate, Workers: min(c.workers, defaultCheckoutWorkers),
					WorkDelay: c.workDelay, LockTTL: c.lockTTL, Seed: c.seed + int64(i), Topology: c.specTopology(),
					Workload: loadtest.WorkloadReservations,
				})
			}
		}
	}
	return specs
}

// The default experiment's reservations runs: checkouts, hot SKUs and
// workers of each (--skus' default for the workload).
const (
	defaultCheckouts       = 200
	defaultCheckoutSKUs    = 4
	defaultCheckoutWorkers = 32
)

// defaultExperiment reports whether no flag chose the matrix.
func (c config) defaultExperiment() bool {
	return c.backends == nil && c.guards == nil && c.gates == nil && c.accepts == nil
}

// acceptList is the accepts to cross: --accept, or sync.
func (c config) acceptList() []string {
	if c.accepts == nil {
		return []string{""}
	}
	return c.accepts
}

// gateList is the gates to cross: --gates, or none.
func (c config) gateList() []string {
	if c.gates == nil {
		return []string{""}
	}
	return c.gates
}

// specWorkload is Spec.Workload: "" for direct orders.
func (c config) specWorkload() string {
	if c.workload == loadtest.WorkloadReservations {
		return c.workload
	}
	return ""
}
