package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oversold-lab/oversold/loadtest"
)

// TestMergeJoinsReports: two labs' report folders become one report, runs
// in the order given, whose faults table sums the cells across both.
func TestMergeJoinsReports(t *testing.T) {
	lane := func(seed int64, safe bool) loadtest.Result {
		r := loadtest.Result{Backend: "redis", Guard: "fencing", Fault: "pause-holder", Replicas: 3, Seed: seed,
			InitialStock: 20, FinalStock: 0, OrderedQuantity: 20, Safe: safe, Overlaps: 1, StaleWritesRefused: 1}
		if !safe {
			r.FinalStock, r.LostUpdates = 1, 1
		}
		return r
	}
	base := t.TempDir()
	a, b, out := filepath.Join(base, "a"), filepath.Join(base, "b"), filepath.Join(base, "merged")
	for dir, rs := range map[string][]loadtest.Result{a: {lane(1, true), lane(2, true)}, b: {lane(3, false)}} {
		if err := loadtest.WriteReport(dir, loadtest.Report{Results: rs}); err != nil {
			t.Fatal(err)
		}
	}

	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"--merge", a + "," + b, "--out", out, "--json"}, &stdout, &stderr); code != exitRan {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	merged, err := loadtest.ReadJSON(&stdout)
	if err != nil {
		t.Fatal(err)
	}
	var seeds []int64
	for _, r := range merged {
		seeds = append(seeds, r.Seed)
	}
	if len(seeds) != 3 || seeds[0] != 1 || seeds[1] != 2 || seeds[2] != 3 {
		t.Errorf("merged seeds %v, want [1 2 3]", seeds)
	}
	md, err := os.ReadFile(filepath.Join(out, loadtest.ResultsMD))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| pause-holder | redis | fencing | NO (2/3) | 3/3 | 0 | 0 | 1 |", "3 runs merged from " + a + ", " + b} {
		if !strings.Contains(string(md), want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	if !strings.Contains(stderr.String(), "NO (2/3)") {
		t.Errorf("the faults table on stderr lacks the summed cell:\n%s", stderr.String())
	}
}

// TestMergeMissingReport: a folder without results.json is a run that
// could not be made (exit 1), and writes nothing.
func TestMergeMissingReport(t *testing.T) {
	out := filepath.Join(t.TempDir(), "merged")
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"--merge", t.TempDir(), "--out", out}, &stdout, &stderr); code != exitCouldNotRun {
		t.Errorf("exit %d, want %d: %s", code, exitCouldNotRun, stderr.String())
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("%s written for a failed merge (%v)", out, err)
	}
}
