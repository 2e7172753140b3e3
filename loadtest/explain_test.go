package loadtest

import (
	"strings"
	"testing"
)

// TestRunNotes: where none/version ran, the report says why it is slow with
// its own figures, and what version costs against fencing under a lock; a
// run's 503s are explained by their error code, in the notes and in the
// fault's story; a run without them gets no note.
func TestRunNotes(t *testing.T) {
	results := []Result{
		{Backend: "none", Guard: "version", ThroughputRPS: 72, LatencyMS: Latency{P50: 1011}, Conflicts: 3594, FinalStock: 26,
			Status: map[string]int{"201": 74, "409": 126}, ErrorCodes: map[string]int{"409 conflict": 126}, Safe: true},
		{Backend: "redis", Guard: "version", ThroughputRPS: 528, LatencyMS: Latency{P50: 108}, Safe: true},
		{Backend: "redis", Guard: "fencing", ThroughputRPS: 463, LatencyMS: Latency{P50: 117}, Safe: true},
		{Backend: "redis", Guard: "fencing", Fault: "redis-restart", Status: map[string]int{"201": 100, "409": 480, "503": 20},
			ErrorCodes: map[string]int{"409 out_of_stock": 480, "503 unavailable": 15, "503 lock_timeout": 5}, Safe: true},
		{Backend: "redis", Guard: "none", Fault: "pause-holder", Status: map[string]int{"201": 100, "409": 500}, Safe: true},
	}
	var notes []string
	for _, n := range RunNotes(results) {
		notes = append(notes, n.Text)
	}
	all := strings.Join(notes, "\n")
	for _, want := range []string{
		"none/version ran at 72 requests/s, p50 1011 ms, with 3594 version conflicts",
		"answers 409 conflict (126 orders here, 26 units left unsold)",
		"Version against fencing: under a lock, version costs about what fencing costs",
		"Here, under redis: version 528 requests/s, p50 108 ms, 0 conflicts; fencing 463 requests/s, p50 117 ms, 0 refused.",
		"redis/fencing+redis-restart: 15 orders answered 503 unavailable: ",
		"Under guards none and fencing a replica stops selling while the Redis cache is away",
		"5 orders answered 503 lock_timeout: the SKU's lock was not granted within the lock wait",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("notes\n%s\nlack %q", all, want)
		}
	}
	if strings.Contains(all, "pause-holder") {
		t.Errorf("a run with no 503 has a note:\n%s", all)
	}
	var story []string
	for _, l := range results[3].StoryLines() {
		story = append(story, l.Text)
	}
	if s := strings.Join(story, "\n"); !strings.Contains(s, "15 orders answered 503 unavailable") {
		t.Errorf("the fault's story does not explain its 503s:\n%s", s)
	}
	if n := RunNotes(results[1:3]); len(n) != 0 {
		t.Errorf("no none/version, no 503: notes %q", n)
	}
}
