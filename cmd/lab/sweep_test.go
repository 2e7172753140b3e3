package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/loadtest"
	"github.com/oversold-lab/oversold/locking/backends"
)

func TestSweepFlags(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		c, err := parseFlags([]string{"--sweep"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(c.sweep.replicas, []int{1, 2, 3, 4}) || !slices.Equal(c.sweep.skus, []int{1, 4, 16}) {
			t.Errorf("replicas %v skus %v, want 1,2,3,4 and 1,4,16", c.sweep.replicas, c.sweep.skus)
		}
		if c.requests != sweepRequests || c.stock != sweepRequests || c.rate != loadtest.SweepRate || c.workDelay != 0 {
			t.Errorf("requests %d stock %d rate %d work delay %s, want %d, %d, %d, 0",
				c.requests, c.stock, c.rate, c.workDelay, sweepRequests, sweepRequests, loadtest.SweepRate)
		}
		if !slices.Equal(c.backends, backends.Names) || !slices.Equal(c.guards, []string{"none"}) {
			t.Errorf("backends %v guards %v, want every backend with guard none", c.backends, c.guards)
		}
		specs := c.specs()
		if len(specs) != 4*3*(len(backends.Names)+3) {
			t.Fatalf("%d runs, want %d", len(specs), 4*3*(len(backends.Names)+3))
		}
		// Cell by cell, each between two reference runs, the ceiling second.
		per := len(backends.Names) + 3
		for i := 0; i < len(specs); i += per {
			cell := specs[i : i+per]
			first, last := cell[0], cell[per-1]
			if !(loadtest.Result{Backend: first.Backend, Guard: first.Guard}).IsReference() ||
				!(loadtest.Result{Backend: last.Backend, Guard: last.Guard}).IsReference() {
				t.Errorf("cell at run %d does not start and end with the reference: %s ... %s", i, first.Name(), last.Name())
			}
			if cell[1].Workload != loadtest.WorkloadCeiling || cell[1].Name() != loadtest.CeilingName {
				t.Errorf("cell at run %d: second run %s (workload %q), want the ceiling", i, cell[1].Name(), cell[1].Workload)
			}
			for _, s := range cell {
				if s.Replicas != first.Replicas || s.SKUs != first.SKUs || s.Rate != loadtest.SweepRate {
					t.Errorf("run %s in cell %d×%d: %d×%d at rate %d", s.Name(), first.Replicas, first.SKUs, s.Replicas, s.SKUs, s.Rate)
				}
			}
		}
	})
	t.Run("narrowed and given", func(t *testing.T) {
		c, err := parseFlags([]string{"--sweep", "--backends", "redis,etcd", "--replicas", "1,3", "--skus", "16",
			"--requests", "100", "--stock", "7", "--rate", "500", "--work-delay", "1ms"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range c.specs() {
			names = append(names, fmt.Sprintf("%s@%d×%d", s.Name(), s.Replicas, s.SKUs))
			if s.Requests != 100 || s.Stock != 7 || s.Rate != 500 || s.WorkDelay != time.Millisecond {
				t.Errorf("%s: requests %d stock %d rate %d work delay %s: given flags must win", s.Name(), s.Requests, s.Stock, s.Rate, s.WorkDelay)
			}
		}
		want := []string{
			"none/atomic@1×16", "ceiling@1×16", "redis/none@1×16", "etcd/none@1×16", "none/atomic@1×16",
			"none/atomic@3×16", "ceiling@3×16", "redis/none@3×16", "etcd/none@3×16", "none/atomic@3×16",
		}
		if !slices.Equal(names, want) {
			t.Errorf("runs %v, want %v", names, want)
		}
	})
	t.Run("gates", func(t *testing.T) {
		c, err := parseFlags([]string{"--sweep", "--backends", "none,redis", "--guards", "atomic", "--gates", "none,redis",
			"--replicas", "3", "--skus", "1"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range c.specs() {
			names = append(names, s.Name())
		}
		// The gated none/atomic is not the reference: it runs between two.
		want := []string{"none/atomic", "ceiling", "none/atomic+gate", "redis/atomic", "redis/atomic+gate", "none/atomic"}
		if !slices.Equal(names, want) {
			t.Errorf("runs %v, want %v", names, want)
		}
		if (loadtest.Result{Backend: "none", Guard: "atomic", Gate: "redis"}).IsReference() {
			t.Error("a gated none/atomic run counts as the reference")
		}
	})
	t.Run("accept", func(t *testing.T) {
		// The queue's cell: the ceiling, the reference, the gate alone and
		// the queue on it; no queue without the gate.
		c, err := parseFlags([]string{"--sweep", "--backends", "none", "--guards", "atomic", "--gates", "none,redis",
			"--accept", "sync,queue", "--replicas", "3", "--skus", "1"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range c.specs() {
			names = append(names, s.Name())
			if s.Accept == "queue" && s.Gate != "redis" {
				t.Errorf("%s: a queue run without the gate", s.Name())
			}
		}
		want := []string{"none/atomic", "ceiling", "none/atomic+gate", "none/atomic+gate+queue", "none/atomic"}
		if !slices.Equal(names, want) {
			t.Errorf("runs %v, want %v", names, want)
		}
		// --accept queue alone: the queue takes the gate.
		c, err = parseFlags([]string{"--sweep", "--backends", "none", "--guards", "atomic", "--accept", "queue",
			"--replicas", "3", "--skus", "1"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		names = nil
		for _, s := range c.specs() {
			names = append(names, s.Name())
		}
		if want := []string{"none/atomic", "ceiling", "none/atomic+gate+queue", "none/atomic"}; !slices.Equal(names, want) {
			t.Errorf("runs %v, want %v", names, want)
		}
		if (loadtest.Result{Backend: "none", Guard: "atomic", Accept: "queue"}).IsReference() {
			t.Error("a queue run counts as the reference")
		}
	})
	t.Run("plain runs take one value", func(t *testing.T) {
		c, err := parseFlags([]string{"--replicas", "2", "--skus", "4"}, &bytes.Buffer{})
		if err != nil || c.replicas != 2 || c.skus != 4 || c.sweep.on {
			t.Fatalf("replicas %d skus %d sweep %v: %v", c.replicas, c.skus, c.sweep.on, err)
		}
	})
	for _, bad := range [][]string{
		{"--replicas", "1,3"},
		{"--skus", "1,4"},
		{"--sweep", "--replicas", "1,0"},
		{"--sweep", "--replicas", "1,33"},
		{"--sweep", "--skus", "1,x"},
		{"--sweep", "--fault", "kill-holder"},
		{"--sweep", "--target", "http://127.0.0.1:8080", "--backends", "redis", "--guards", "none"},
	} {
		t.Run(strings.Join(bad, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(t.Context(), bad, &stdout, &stderr); code != exitBadFlags {
				t.Errorf("exit %d, want %d; stderr %q", code, exitBadFlags, stderr.String())
			}
		})
	}
}

// TestSweepEndToEnd runs a tiny real sweep: MariaDB, Redis, orderd as an
// OS process, one cell, the redis backend between two reference runs, and
// the HTTP ceiling.
func TestSweepEndToEnd(t *testing.T) {
	needServers(t)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"--sweep", "--backends", "redis", "--replicas", "1", "--skus", "1",
		"--requests", "60", "--out", out}, &stdout, &stderr)
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
	var names []string
	for _, r := range results {
		names = append(names, r.Name())
		if r.IsCeiling() {
			// GET /healthz only: every answer a 200, no stock, no order.
			if r.Error != "" || r.Status["200"] != 60 || len(r.Status) != 1 || r.ThroughputRPS <= 0 || r.InitialStock != 0 || r.OrdersRPS != 0 || r.Replicas != 1 {
				t.Errorf("ceiling: error %q, answers %v, %v answers/s, stock %d, orders/s %v, %d replicas", r.Error, r.Status, r.ThroughputRPS, r.InitialStock, r.OrdersRPS, r.Replicas)
			}
			continue
		}
		if r.Error != "" || !r.Safe || r.Status["201"] != 60 || r.InitialStock != 60 || r.OrdersRPS <= 0 {
			t.Errorf("%s: error %q safe %v, 201s %d of 60, stock %d, orders/s %v", r.Name(), r.Error, r.Safe, r.Status["201"], r.InitialStock, r.OrdersRPS)
		}
		if r.Rate != loadtest.SweepRate || r.WorkDelay != "0s" || r.Replicas != 1 || r.SKUs != 1 {
			t.Errorf("%s: rate %d work delay %s, %d×%d", r.Name(), r.Rate, r.WorkDelay, r.Replicas, r.SKUs)
		}
		if r.PeakRSSMB <= 0 || r.ReplicaPeakRSSMB["r1"] != r.PeakRSSMB {
			t.Errorf("%s: peak RSS %v MiB, by replica %v", r.Name(), r.PeakRSSMB, r.ReplicaPeakRSSMB)
		}
	}
	if want := []string{"none/atomic", "ceiling", "redis/none", "none/atomic"}; !slices.Equal(names, want) {
		t.Fatalf("runs %v, want %v", names, want)
	}
	md, err := os.ReadFile(filepath.Join(out, loadtest.SweepMD))
	if err != nil {
		t.Fatal(err)
	}
	p, ok := loadtest.NewSweep(results).Point("redis/none", loadtest.Cell{Replicas: 1, SKUs: 1})
	if !ok || !p.HasRatio || p.Ratio <= 0 || !p.HasCeiling || p.CeilingRatio <= 0 {
		t.Fatalf("redis/none point %+v: want a ratio to the reference and to the ceiling", p)
	}
	for _, want := range []string{"| none/atomic (reference) |", "| ceiling (GET /healthz, answers/s) |", "| redis/none |", "## Every run"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("sweep.md lacks %q", want)
		}
		if want != "## Every run" && !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
}
