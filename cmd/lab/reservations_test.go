package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oversold-lab/oversold/loadtest"
)

// TestLabReservations: the reservations workload end to end (three orderd
// processes, real MariaDB and Redis, the redis lock, guard version):
// checkouts of 1 to 3 SKUs, lines in random order, hold, confirm, cancel
// and abandon across the processes, none waiting out its lock wait (no
// deadlock); once every hold has ended MySQL keeps every invariant, the
// stock ledger explains every row, nothing is left reserved or stuck, and
// the report shows the reservations table and timeline.
func TestLabReservations(t *testing.T) {
	needServers(t)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{
		"--workload", "reservations", "--backends", "redis", "--guards", "version",
		"--stock", "10", "--requests", "80", "--workers", "16", "--out", out, "--json",
	}, &stdout, &stderr)
	t.Logf("stderr:\n%s", stderr.String())
	if code != exitRan {
		t.Fatalf("exit %d, want %d", code, exitRan)
	}
	var results []loadtest.Result
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil || len(results) != 1 {
		t.Fatalf("stdout: %v, %d runs", err, len(results))
	}
	r := results[0]
	t.Logf("%+v", r.Checkouts)
	if r.Error != "" || r.Workload != "reservations" || r.ReservedLeft == nil || r.DoubleSettled == nil || r.StuckHolds == nil {
		t.Fatalf("run %+v: want a reservations run with reserved_left, double_settled, stuck_holds", r)
	}
	if !r.Safe || *r.ReservedLeft != 0 || *r.DoubleSettled != 0 || *r.StuckHolds != 0 || r.Oversold != 0 || r.LostUpdates != 0 || r.LostAcks != 0 {
		t.Errorf("unsafe: reserved left %d, double settled %d, stuck %d, oversold %d, lost updates %d, lost acks %d",
			*r.ReservedLeft, *r.DoubleSettled, *r.StuckHolds, r.Oversold, r.LostUpdates, r.LostAcks)
	}
	if r.LedgerMismatch == nil || *r.LedgerMismatch != 0 {
		t.Errorf("ledger mismatch %v, want 0: every row explained by the stock ledger", r.LedgerMismatch)
	}
	c := r.Checkouts
	// Holds of 1 to 3 SKUs in random line order across three processes:
	// a deadlock would show as lock_timeout (503), or as no answer.
	for outcome, n := range c {
		if strings.Contains(outcome, " 5") || strings.Contains(outcome, "no answer") {
			t.Errorf("%d checkouts got %q: want none (no deadlock, nothing unavailable)", n, outcome)
		}
	}
	if c["hold 201"] == 0 || c["confirm 200"] == 0 || c["cancel 200"] == 0 || c["abandoned"] == 0 {
		t.Errorf("checkouts %v: want holds, confirms, cancels and abandoned holds", c)
	}
	if r.OrderedQuantity == 0 || r.FinalStock+r.OrderedQuantity != r.InitialStock {
		t.Errorf("sold %d, final %d of %d: with nothing reserved, stock + sold = stock set", r.OrderedQuantity, r.FinalStock, r.InitialStock)
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
