package loadtest

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// designRun is docs/design.md's example run, verbatim: the contract.
const designRun = `{"backend": "redis", "guard": "none", "replicas": 3, "fault": "",
 "requests": 600, "status": {"201": 100, "409": 500},
 "initial_stock": 100, "final_stock": 0, "ordered_quantity": 100,
 "oversold": 0, "lost_updates": 0, "lost_acks": 0, "duplicates": 0,
 "throughput_rps": 812.4, "latency_ms": {"p50": 3.1, "p90": 7.9, "p99": 14.2, "max": 30.5}}`

func TestResultsJSONKeepsDesignSchema(t *testing.T) {
	var design map[string]any
	if err := json.Unmarshal([]byte(designRun), &design); err != nil {
		t.Fatal(err)
	}
	// DESIGN's run decodes into a Result and encodes back to the same
	// values under the same names.
	runs, err := ReadJSON(strings.NewReader("[" + designRun + "]"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, runs); err != nil {
		t.Fatal(err)
	}
	var back []map[string]any
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	for key, want := range design {
		got, ok := back[0][key]
		if !ok {
			t.Errorf("field %q missing from results.json", key)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("field %q = %v, want %v", key, got, want)
		}
	}
	r := runs[0]
	if r.Backend != "redis" || r.Status["409"] != 500 || r.LatencyMS.P99 != 14.2 || r.ThroughputRPS != 812.4 {
		t.Errorf("decoded %+v", r)
	}
}

func TestWriteJSONEmptyIsList(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, nil); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(buf.String()); got != "[]" {
		t.Errorf("no runs encode as %s, want []", got)
	}
}

func sampleResults() []Result {
	return []Result{{
		Backend: "local", Guard: "none", Replicas: 3, Requests: 600,
		Status:       map[string]int{"201": 131, "409": 469},
		InitialStock: 100, FinalStock: 0, OrderedQuantity: 131, Oversold: 31, LostUpdates: 31,
		ThroughputRPS: 298.7, OrdersRPS: 65.2, LatencyMS: Latency{P50: 4.2, P90: 9.1, P99: 20.3, Max: 41},
		LockWaitMS: &Wait{Count: 600, Mean: 1.2, P50: 0.4, P99: 8.8}, Linearizable: NotLinearizable,
		OverTime: []Slice{{At: 0, Requests: 30, Created: 30, P50: 3, P99: 9}, {At: 0.1, Requests: 30, P50: 2, P99: 5}},
	}, {
		Backend: "redis", Guard: "none", Replicas: 3, Requests: 600,
		Status:       map[string]int{"201": 100, "409": 500},
		InitialStock: 100, OrderedQuantity: 100, ThroughputRPS: 287.1, Safe: true, Linearizable: Linearizable,
		OverTime: []Slice{{At: 0, Requests: 30, Created: 30, P50: 5, P99: 19}},
	}, {
		Backend: "etcd", Guard: "none", Replicas: 3, Requests: 600, Status: map[string]int{},
		Error: "replica r1 exited at start (exit status 2): OVERSOLD_LOCK: unknown lock backend \"etcd\"",
	}}
}

func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	rep := Report{Results: sampleResults(), Machine: ThisMachine(), Command: "lab --backends local,redis,etcd",
		Started: time.Now(), Wall: 42 * time.Second}
	if err := WriteReport(dir, rep); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	f, err := os.Open(filepath.Join(dir, ResultsJSON))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	back, err := ReadJSON(f)
	if err != nil || len(back) != 3 || back[0].Oversold != 31 {
		t.Errorf("results.json read back as %d runs, %v", len(back), err)
	}

	md := read(ResultsMD)
	for _, want := range []string{"| local/none |", "OVERSOLD 31", "| redis/none |", "safe", "FAILED", rep.Machine.CPU, "lab --backends",
		"| run | verdict | answers |", "| local/none | OVERSOLD 31, 31 LOST UPDATES |", "| redis/none | safe |", "| oversold | undersold |"} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q", want)
		}
	}

	page := read(ReportHTML)
	// Four charts, each drawn for a screen and for a phone.
	if n := strings.Count(page, "<svg"); n != 8 {
		t.Errorf("report.html has %d charts, want 8", n)
	}
	for _, bad := range []string{"http://cdn", "https://", "<script"} {
		if strings.Contains(page, bad) {
			t.Errorf("report.html contains %q: it must open offline", bad)
		}
	}
	for _, want := range []string{"local/none", "OVERSOLD 31", "<polyline", rep.Machine.CPU,
		"linearizable in 1, not linearizable in 1, unknown (timed out) in 0 of 2 runs"} {
		if !strings.Contains(page, want) {
			t.Errorf("report.html lacks %q", want)
		}
	}
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, sampleResults()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("table has %d lines, want header and 3 runs:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[1], "201×131 409×469") || !strings.Contains(lines[1], "131/100") {
		t.Errorf("local row: %s", lines[1])
	}
}

func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		max  float64
		want []float64
	}{{0, []float64{0, 1}}, {9, []float64{0, 2, 4, 6, 8, 10}}, {31, []float64{0, 10, 20, 30, 40}}, {0.3, []float64{0, 0.1, 0.2, 0.3}}} {
		got := ticks(tc.max)
		if !slices.Equal(got, tc.want) {
			t.Errorf("ticks(%v) = %v, want %v", tc.max, got, tc.want)
		}
	}
}
