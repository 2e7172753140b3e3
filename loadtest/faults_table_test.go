package loadtest

import (
	"bytes"
	"strings"
	"testing"
)

func TestFaultRows(t *testing.T) {
	ms, fast, slow := 1500.0, 1000.0, 4000.0
	results := []Result{
		{Backend: "redis", Guard: "none"}, // no fault: left out
		{Backend: "redis", Guard: "none", Fault: "pause-holder", Overlaps: 1, LostUpdates: 1},
		{Backend: "redis", Guard: "none", Fault: "pause-holder", Overlaps: 2, Safe: true},
		{Backend: "redis", Guard: "version", Fault: "kill-holder", Safe: true, RecoveryMS: &ms, StaleWritesRefused: 3},
		{Backend: "local", Guard: "none", Fault: "pause-holder", NotApplicable: true},
		{Backend: "etcd", Guard: "none", Fault: "pause-holder", NotFired: true, Safe: true},
		{Backend: "redis", Guard: "none", Fault: "kill-holder", Safe: true, RecoveryMS: &slow},
		{Backend: "redis", Guard: "none", Fault: "kill-holder", Safe: true, RecoveryMS: &fast},
		{Backend: "redis", Guard: "none", Fault: "kill-holder", Safe: true, RecoveryMS: &ms},
	}
	rows := FaultRows(results)
	if len(rows) != 5 {
		t.Fatalf("%d rows, want 5: %+v", len(rows), rows)
	}
	if got := strings.Join(rows[0].Cells(), " "); got != "pause-holder redis none NO (1/2) 2/2 0 0 1 0 3 0 -" {
		t.Errorf("row 0: %q", got)
	}
	if got := strings.Join(rows[1].Cells(), " "); got != "kill-holder redis version yes 1/1 0 0 0 0 0 3 1500" {
		t.Errorf("row 1: %q", got)
	}
	if !rows[2].NotApplicable || rows[2].Cells()[3] != "n/a" {
		t.Errorf("row 2: %+v", rows[2])
	}
	if s := results[3].Story(); !strings.Contains(s, "guard version refused 3 stale writes") || !strings.Contains(s, "orders resumed after 1500 ms") {
		t.Errorf("story %q", s)
	}
	if got := rows[3].Cells()[4]; got != "0/1" {
		t.Errorf("row 3 fired %q, want 0/1", got)
	}
	if got := rows[4].Cells()[11]; got != "1500 (max 4000)" {
		t.Errorf("recovery over three runs %q, want the median and the longest", got)
	}
	if s := results[5].Story(); !strings.HasPrefix(s, "FAULT DID NOT FIRE") {
		t.Errorf("story of a fault that did not fire: %q", s)
	}
	var md bytes.Buffer
	writeFaultsMarkdown(&md, results)
	if !strings.Contains(md.String(), "## Faults") || !strings.Contains(md.String(), "**redis/none+pause-holder**") {
		t.Errorf("markdown:\n%s", md.String())
	}
}

func TestFleetConfigEnv(t *testing.T) {
	cfg := FleetConfig{Env: map[string]string{"A": "1", "B": "2"}, Each: []map[string]string{nil, {"B": "3"}}}
	if got := cfg.env(0); got["B"] != "2" {
		t.Errorf("replica 0: %v", got)
	}
	if got := cfg.env(1); got["B"] != "3" || got["A"] != "1" {
		t.Errorf("replica 1: %v", got)
	}
	if cfg.Env["B"] != "2" {
		t.Errorf("shared env changed: %v", cfg.Env)
	}
}
