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

// needServers skips the test when MariaDB, Redis or one of more (testbed
// kinds) is not installed, or fails it when OVERSOLD_REQUIRE_SERVERS=1
// (make test, CI).
func needServers(t *testing.T, more ...string) {
	t.Helper()
	for _, kind := range append([]string{testbed.KindMariaDB, testbed.KindRedis}, more...) {
		if cmd := testbed.Missing(kind); cmd != "" {
			if os.Getenv(testbed.EnvRequireServers) == "1" {
				t.Fatalf("%s is not installed: %s", kind, cmd)
			}
			t.Skipf("%s is not installed: %s", kind, cmd)
		}
	}
}

// TestLabEndToEnd runs the lab as `make lab` does, in a small configuration:
// real MariaDB and Redis, the real orderd binary as three OS processes, the
// balancer, vegeta, the checker. Every run whose lock or guard is meant to
// be safe must sell exactly the stock and keep every invariant; the unsafe
// ones (local or no lock, guard none) are only reported: a short run may or
// may not catch the race.
func TestLabEndToEnd(t *testing.T) {
	needServers(t)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{
		"--backends", "none,local,redis", "--guards", "none,atomic",
		"--stock", "20", "--requests", "120", "--rate", "200", "--workers", "32",
		"--out", out, "--json",
	}, &stdout, &stderr)
	t.Logf("stderr:\n%s", stderr.String())
	if code != exitRan {
		t.Fatalf("exit %d, want %d", code, exitRan)
	}

	// stdout holds the results array and nothing else.
	var fromStdout []loadtest.Result
	if err := json.Unmarshal(stdout.Bytes(), &fromStdout); err != nil {
		t.Fatalf("stdout is not the results array: %v\n%s", err, stdout.String())
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
	if len(results) != 6 || len(fromStdout) != len(results) {
		t.Fatalf("%d runs in results.json, %d on stdout; want 6", len(results), len(fromStdout))
	}
	for _, name := range []string{loadtest.ResultsMD, loadtest.ReportHTML} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Error(err)
		}
	}

	safe := map[string]bool{"none/atomic": true, "local/atomic": true, "redis/none": true, "redis/atomic": true}
	for _, r := range results {
		t.Logf("%-13s %s sold %d/%d oversold %d lost updates %d lost acks %d dup %d, %.0f req/s p99 %.1f ms: %s",
			r.Name(), statusLine(r), r.OrderedQuantity, r.InitialStock, r.Oversold, r.LostUpdates,
			r.LostAcks, r.Duplicates, r.ThroughputRPS, r.LatencyMS.P99, r.Verdict())
		if r.Error != "" {
			t.Errorf("%s could not run: %s", r.Name(), r.Error)
			continue
		}
		if r.Replicas != 3 || r.Requests != 120 || r.InitialStock != 20 || answered(r) != 120 {
			t.Errorf("%s: replicas %d, requests %d, initial stock %d, answered %d", r.Name(), r.Replicas, r.Requests, r.InitialStock, answered(r))
		}
		if r.LostAcks != 0 || r.Duplicates != 0 {
			t.Errorf("%s: lost acks %d, duplicates %d: no combination may lose an acknowledged order or duplicate a key",
				r.Name(), r.LostAcks, r.Duplicates)
		}
		if !safe[r.Name()] {
			continue
		}
		if !r.Safe || r.OrderedQuantity != 20 || r.FinalStock != 0 || r.Oversold != 0 || r.LostUpdates != 0 || r.Status["201"] != 20 {
			t.Errorf("%s must sell exactly the stock: sold %d, final %d, oversold %d, lost updates %d, 201s %d",
				r.Name(), r.OrderedQuantity, r.FinalStock, r.Oversold, r.LostUpdates, r.Status["201"])
		}
	}
}

func answered(r loadtest.Result) int {
	n := r.NoResponse
	for _, c := range r.Status {
		n += c
	}
	return n
}

// statusLine mirrors the table's answers column for the log.
func statusLine(r loadtest.Result) string {
	b, _ := json.Marshal(r.Status)
	return strings.Trim(string(b), "{}")
}

// TestLabCouldNotRun: when no run can be made (here orderd exits at once),
// the lab still writes its report, naming the failure, and exits 1.
func TestLabCouldNotRun(t *testing.T) {
	needServers(t)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"--backends", "local", "--orderd", "/bin/false", "--out", out, "--json"}, &stdout, &stderr)
	if code != exitCouldNotRun {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitCouldNotRun, stderr.String())
	}
	var results []loadtest.Result
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil || len(results) != 1 {
		t.Fatalf("stdout %q: %v", stdout.String(), err)
	}
	if !strings.Contains(results[0].Error, "exited at start") || results[0].Safe {
		t.Errorf("error %q, safe %v", results[0].Error, results[0].Safe)
	}
	if !strings.Contains(stderr.String(), "no run could be made") {
		t.Errorf("stderr does not say why:\n%s", stderr.String())
	}
}

// TestLabQueue: a run with accept queue sells the stock through 202s, then
// drains before its replicas stop: every accepted order confirmed, none
// lost or left pending, and the time to confirm reported.
func TestLabQueue(t *testing.T) {
	needServers(t)
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{
		"--backends", "none", "--guards", "atomic", "--accept", "queue",
		"--stock", "20", "--requests", "120", "--rate", "200", "--workers", "32",
		"--out", out, "--json",
	}, &stdout, &stderr)
	t.Logf("stderr:\n%s", stderr.String())
	if code != exitRan {
		t.Fatalf("exit %d, want %d", code, exitRan)
	}
	var results []loadtest.Result
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil || len(results) != 1 {
		t.Fatalf("stdout: %v, %d runs; want one", err, len(results))
	}
	r := results[0]
	if r.Name() != "none/atomic+gate+queue" || r.Gate != "redis" || r.Accept != "queue" {
		t.Fatalf("run %s (gate %q, accept %q), want none/atomic+gate+queue", r.Name(), r.Gate, r.Accept)
	}
	if r.Accepted == nil || r.RejectedAfterAccept == nil || r.LostAccepted == nil || r.PendingLeft == nil || r.ConfirmMS == nil {
		t.Fatalf("%s lacks the queue's figures: %+v", r.Name(), r)
	}
	if !r.Safe || r.Status["202"] != 20 || *r.Accepted != 20 || *r.RejectedAfterAccept != 0 || *r.LostAccepted != 0 || *r.PendingLeft != 0 ||
		r.OrderedQuantity != 20 || r.FinalStock != 0 || r.ConfirmMS.Count != 20 {
		t.Errorf("%s: %s, 202s %d, accepted %d, rejected %d, lost %d, pending %d, sold %d, final %d, confirmed %d; want the stock sold through 20 202s, each confirmed",
			r.Name(), r.Verdict(), r.Status["202"], *r.Accepted, *r.RejectedAfterAccept, *r.LostAccepted, *r.PendingLeft, r.OrderedQuantity, r.FinalStock, r.ConfirmMS.Count)
	}
	// The backlog over time: every 202 and every outcome in a slice, the
	// stream and each replica's memory sampled, the rates.
	accepted, settled := 0, 0
	for _, s := range r.QueueTimeline {
		accepted, settled = accepted+s.Accepted, settled+s.Confirmed+s.Rejected
	}
	if accepted != 20 || settled != 20 {
		t.Errorf("timeline %+v: %d accepted, %d settled; want 20 and 20", r.QueueTimeline, accepted, settled)
	}
	if r.StreamLenMax == nil || len(r.ReplicaRSSStartMB) != 3 || len(r.ReplicaRSSEndMB) != 3 || r.AcceptedRPS <= 0 || r.SettledRPS <= 0 {
		t.Errorf("stream_len_max %v, rss start %v end %v, accepted/s %v, settled/s %v: want the stream and the 3 replicas sampled, and both rates",
			r.StreamLenMax, r.ReplicaRSSStartMB, r.ReplicaRSSEndMB, r.AcceptedRPS, r.SettledRPS)
	}
}
