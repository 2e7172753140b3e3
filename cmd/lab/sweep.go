package main

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/oversold-lab/oversold/loadtest"
	"github.com/oversold-lab/oversold/locking/backends"
)

// --sweep: every backend, at every replica count and SKU count asked, next
// to the lock-free reference (lock none, guard atomic) and the HTTP ceiling
// (GET /healthz) measured in the same run at the same counts. See
// loadtest.NewSweep for the table.

const sweepHelp = `measure what each lock costs end to end: every backend (or --backends) with
guard none (or --guards), at replicas 1,2,3,4 and SKUs 1,4,16 (or the lists
--replicas and --skus give), each cell also running the reference, lock none
with guard atomic, first and last, and the HTTP ceiling, GET /healthz unpaced
through the same balancer and replicas. --gates and --accept cross as in a
plain lab (a queue run needs the gate); a +queue run is measured by its 202s
per second, its outcomes per second beside. Unless given: --requests 1000, --stock = --requests
(no run sells out: every answer is an order), --rate 100000 (unpaced: the
workers are the limit), --work-delay 0 (a pure cost comparison). --repeat N
runs each cell's round N times. Writes sweep.md to --out and prints its tables`

// Sweep defaults, for the flags not given.
var (
	sweepReplicas = []int{1, 2, 3, 4}
	sweepSKUs     = []int{1, 4, 16}
)

const sweepRequests = 1000

// sweepConfig is what --sweep adds to the command line.
type sweepConfig struct {
	on             bool
	replicas, skus []int // every value --replicas and --skus gave
}

// intList is a flag taking one integer, or with --sweep a comma-separated
// list: first gets the first value (what a plain run uses), all every one.
type intList struct {
	first *int
	all   *[]int
}

func (l intList) String() string {
	if l.all == nil || len(*l.all) == 0 {
		if l.first == nil {
			return ""
		}
		return strconv.Itoa(*l.first)
	}
	parts := make([]string, len(*l.all))
	for i, n := range *l.all {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

func (l intList) Set(v string) error {
	var out []int
	for _, item := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(item))
		if err != nil {
			return fmt.Errorf("want an integer or a comma-separated list of them, got %q", v)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	*l.first, *l.all = out[0], out
	return nil
}

// checkSweep validates --sweep against the other flags and fills in the
// sweep's defaults for the flags not given. Without --sweep, it only
// refuses lists where one value is wanted.
func (c *config) checkSweep(given map[string]bool) error {
	if !c.sweep.on {
		for name, l := range map[string][]int{"replicas": c.sweep.replicas, "skus": c.sweep.skus} {
			if len(l) > 1 {
				return badFlag(name, "a list needs --sweep")
			}
		}
		return nil
	}
	switch {
	case c.target != "":
		return badFlag("sweep", "starts its own replicas, at each count: not with --target")
	case c.faults != nil:
		return badFlag("sweep", "measures cost without faults: not with --fault")
	}
	if !given["replicas"] {
		c.sweep.replicas = sweepReplicas
	}
	if !given["skus"] {
		c.sweep.skus = sweepSKUs
	}
	for _, n := range c.sweep.replicas {
		if n < 1 || n > 32 {
			return badFlag("replicas", "each from 1 to 32, got %d", n)
		}
	}
	for _, n := range c.sweep.skus {
		if n < 1 {
			return badFlag("skus", "each at least 1, got %d", n)
		}
	}
	if !given["requests"] {
		c.requests = sweepRequests
	}
	if !given["stock"] {
		c.stock = c.requests
	}
	if !given["rate"] {
		c.rate = loadtest.SweepRate
	}
	if !given["work-delay"] {
		c.workDelay = 0
	}
	if c.backends == nil {
		c.backends = slices.Clone(backends.Names)
	}
	if c.guards == nil {
		c.guards = []string{"none"}
	}
	return nil
}

// sweepSpecs is the sweep in run order: cell by cell (replicas, then SKUs),
// each cell the reference, the ceiling, every backend and guard, and the
// reference again, so that the reference's figure (the mean of both)
// straddles the backends'. With
// --repeat the cell runs that round again (seeds --seed, --seed+1, ...):
// repeats of one configuration are spread over the cell, not back to back.
func (c config) sweepSpecs() []loadtest.Spec {
	var specs []loadtest.Spec
	add := func(backend, guard, gate, accept string, replicas, skus int, seed int64) *loadtest.Spec {
		specs = append(specs, loadtest.Spec{
			Backend: backend, Guard: guard, Gate: gate, Accept: accept, Replicas: replicas,
			Stock: c.stock, SKUs: skus, Requests: c.requests, Rate: c.rate, Workers: c.workers,
			WorkDelay: c.workDelay, LockTTL: c.lockTTL, Seed: seed, Topology: c.specTopology(),
		})
		return &specs[len(specs)-1]
	}
	for _, r := range c.sweep.replicas {
		for _, k := range c.sweep.skus {
			for i := range max(c.repeat, 1) {
				seed := c.seed + int64(i)
				add(loadtest.ReferenceBackend, loadtest.ReferenceGuard, "", "", r, k, seed)
				// The replicas need a lock and guard to start; /healthz uses neither.
				add("none", "none", "", "", r, k, seed).Workload = loadtest.WorkloadCeiling
				for _, b := range c.backends {
					for _, g := range c.guards {
						for _, gate := range c.gateList() {
							for _, accept := range c.acceptList() {
								gate := gate
								switch {
								case accept == "queue" && gate == "" && c.gates != nil:
									continue // --gates none: the queue needs the gate
								case accept == "queue" && gate == "":
									gate = "redis" // no --gates: the queue takes it
								case b == loadtest.ReferenceBackend && g == loadtest.ReferenceGuard && gate == "" && accept == "":
									continue // the reference, first and last
								}
								add(b, g, gate, accept, r, k, seed)
							}
						}
					}
				}
				add(loadtest.ReferenceBackend, loadtest.ReferenceGuard, "", "", r, k, seed)
			}
		}
	}
	return specs
}

// sweepLabel adds the cell to a run's progress label.
func sweepLabel(s loadtest.Spec) string {
	return fmt.Sprintf(" %d replicas %d SKUs", s.Replicas, s.SKUs)
}

// reportSweep writes sweep.md to the report folder and the sweep's tables
// to stderr.
func reportSweep(out string, rep loadtest.Report, stderr io.Writer) error {
	if err := loadtest.WriteSweepFile(out, rep); err != nil {
		return err
	}
	fmt.Fprintln(stderr)
	loadtest.WriteSweepTables(stderr, rep.Results)
	fmt.Fprintf(stderr, "sweep: %s\n", filepath.Join(out, loadtest.SweepMD))
	return nil
}
