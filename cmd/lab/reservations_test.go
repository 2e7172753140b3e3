package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// TestLabReservations: the reservations workload end to end, a black-box
// storm on every distributed backend (three orderd
// processes, real MariaDB, Redis, Redis masters, ZooKeeper and etcd, guard
// version): 24 clients at once, checkouts of 1 or 2 of 2 hot SKUs, the two
// lines in random order, so both orders meet on the same rows; hold,
// confirm, cancel and abandon across the processes, none waiting out its
// lock wait (no deadlock). Once every hold has ended MySQL keeps every
// invariant (nothing over-reserved or oversold), the stock ledger explains
// every row, every hold was settled once (nothing left reserved or stuck,
// nothing given back twice), and the report shows the reservations table
// and timeline.
func TestLabReservations(t *testing.T) {
	needServers(t, testbed.KindZooKeeper, testbed.KindEtcd)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{
		"--workload", "reservations", "--backends", strings.Join(distributed, ","), "--guards", "version",
		"--skus", "2", "--stock", "40", "--requests", "80", "--workers", "24", "--out", out, "--json",
	}, &stdout, &stderr)
	t.Logf("stderr:\n%s", stderr.String())
	if code != exitRan {
		t.Fatalf("exit %d, want %d", code, exitRan)
	}
	var results []loadtest.Result
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil || len(results) != len(distributed) {
		t.Fatalf("stdout: %v, %d runs, want %d", err, len(results), len(distributed))
	}
	for _, r := range results {
		checkStorm(t, r)
	}
	page, err := os.ReadFile(filepath.Join(out, loadtest.ReportHTML))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<h2>Reservations</h2>", "reservations held, confirmed, cancelled and expired over time", "stuck holds"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("report.html lacks %q", want)
		}
	}
}

// distributed is the lock backends the storm runs on.
var distributed = []string{"redis", "redlock", "zookeeper", "mysql", "etcd"}

// checkStorm checks one reservations run of TestLabReservations.
func checkStorm(t *testing.T, r loadtest.Result) {
	t.Helper()
	name := r.Name()
	t.Logf("%s: %+v", name, r.Checkouts)
	if r.Error != "" || r.Workload != "reservations" || r.ReservedLeft == nil || r.DoubleSettled == nil || r.StuckHolds == nil {
		t.Errorf("%s: run %+v: want a reservations run with reserved_left, double_settled, stuck_holds", name, r)
		return
	}
	if !r.Safe || *r.ReservedLeft != 0 || *r.DoubleSettled != 0 || *r.StuckHolds != 0 || r.Oversold != 0 || r.LostUpdates != 0 || r.LostAcks != 0 {
		t.Errorf("%s unsafe: reserved left %d, double settled %d, stuck %d, oversold %d, lost updates %d, lost acks %d", name,
			*r.ReservedLeft, *r.DoubleSettled, *r.StuckHolds, r.Oversold, r.LostUpdates, r.LostAcks)
	}
	if r.LedgerMismatch == nil || *r.LedgerMismatch != 0 {
		t.Errorf("%s: ledger mismatch %v, want 0: every row explained by the stock ledger", name, r.LedgerMismatch)
	}
	c := r.Checkouts
	// Holds of two SKUs in both line orders across three processes: a
	// deadlock would show as lock_timeout (503), or as no answer.
	for outcome, n := range c {
		if strings.Contains(outcome, " 5") || strings.Contains(outcome, "no answer") {
			t.Errorf("%s: %d checkouts got %q: want none (no deadlock, nothing unavailable)", name, n, outcome)
		}
	}
	if c["hold 201"] == 0 || c["confirm 200"] == 0 || c["cancel 200"] == 0 || c["abandoned"] == 0 {
		t.Errorf("%s: checkouts %v: want holds, confirms, cancels and abandoned holds", name, c)
	}
	if r.OrderedQuantity == 0 || r.FinalStock+r.OrderedQuantity != r.InitialStock {
		t.Errorf("%s: sold %d, final %d of %d: with nothing reserved, stock + sold = stock set", name, r.OrderedQuantity, r.FinalStock, r.InitialStock)
	}
}
