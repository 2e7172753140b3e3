package loadtest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// drainQueue counts what became of a queue run's 202s: confirmed and
// rejected from MySQL's outcomes (confirm_ms from the 202 to settled_at),
// pending when a replica still shows the order pending after the bound,
// lost when no replica knows it.
func TestDrainQueue(t *testing.T) {
	db := crafted{}.database(t)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, o := range []struct {
		id, status string
		after      time.Duration
	}{{"a1", "confirmed", 100 * time.Millisecond}, {"a2", "rejected", 300 * time.Millisecond}} {
		if _, err := db.ExecContext(t.Context(), "INSERT INTO queued_orders (id, sku, quantity, status, instance, `lock`, created_at, settled_at)"+
			" VALUES (?, 's', 1, ?, 'r1', 'none', ?, ?)", o.id, o.status, at, at.Add(o.after)); err != nil {
			t.Fatal(err)
		}
	}
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/a3") {
			w.Write([]byte(`{"id":"a3","status":"pending"}`))
			return
		}
		http.Error(w, `{"error":{"code":"not_found","message":"no such order"}}`, http.StatusNotFound)
	}))
	t.Cleanup(replica.Close)
	var res Result
	accepted := []Accepted{{"a1", at}, {"a2", at}, {"a3", at}, {"a4", at}}
	if _, err := drainQueue(t.Context(), db, []string{replica.URL}, accepted, 200*time.Millisecond, &res); err != nil {
		t.Fatal(err)
	}
	got := func(p *int) int {
		if p == nil {
			return -1
		}
		return *p
	}
	if got(res.Accepted) != 4 || got(res.RejectedAfterAccept) != 1 || got(res.PendingLeft) != 1 || got(res.LostAccepted) != 1 {
		t.Errorf("accepted %d, rejected %d, pending %d, lost %d; want 4, 1, 1, 1",
			got(res.Accepted), got(res.RejectedAfterAccept), got(res.PendingLeft), got(res.LostAccepted))
	}
	if c := res.ConfirmMS; c == nil || c.Count != 2 || c.P50 != 100 || c.P99 != 300 {
		t.Errorf("confirm_ms %+v, want 2 outcomes, p50 100, p99 300", c)
	}
	res.settle(nil)
	if res.Safe || !strings.Contains(res.Verdict(), "1 LOST ACCEPTED") || !strings.Contains(res.Verdict(), "1 PENDING LEFT") {
		t.Errorf("safe %v, verdict %q: want unsafe, naming the lost and the pending order", res.Safe, res.Verdict())
	}
}

// The summary says what a queue run's 202s became, and a lost 202 is
// damage.
func TestQueueSummary(t *testing.T) {
	n := func(v int) *int { return &v }
	r := Result{Backend: "none", Guard: "atomic", Gate: "redis", Accept: "queue", Status: map[string]int{"202": 3},
		Accepted: n(3), RejectedAfterAccept: n(1), LostAccepted: n(1), PendingLeft: n(0), ConfirmMS: &Wait{Count: 2, P50: 120, P99: 900}}
	r.settle(nil)
	got := strings.Join(Summary([]Result{r}), " ")
	for _, want := range []string{
		"none/atomic+gate+queue lost 1 accepted order",
		"none/atomic+gate+queue answered 3 orders 202 (accepted, written later); each learned its outcome 120 ms after its 202 at the median, 900 ms at p99; 1 rejected after their 202, 1 lost, 0 still pending after the drain.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary %q does not say %q", got, want)
		}
	}
	// With its rates and the stream's longest length.
	var longest int64 = 172
	r.AcceptedRPS, r.SettledRPS, r.StreamLenMax = 2202, 2148, &longest
	got = strings.Join(Summary([]Result{r}), " ")
	if want := "0 still pending after the drain. It accepted 2202 orders/s and MySQL took their outcomes at 2148/s; the stream held at most 172 entries."; !strings.Contains(got, want) {
		t.Errorf("summary %q does not say %q", got, want)
	}
}

// queueTimeline slices a queue run from its first request sent: 202s by
// their answer, outcomes by MySQL's settled_at, the stream's length and
// the replicas' memory as sampled; outcomes per second up to the last
// outcome, the longest stream, each replica's memory first and last.
func TestQueueTimeline(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	accepted := []Accepted{{"a", at(50)}, {"b", at(120)}, {"c", at(130)}, {"d", at(350)}}
	outcomes := map[string]queueOutcome{
		"a": {"confirmed", at(210)}, "b": {"confirmed", at(220)}, "c": {"rejected", at(390)}, "d": {"confirmed", at(400)},
	}
	samples := []queueSample{
		{at: at(0), streamLen: 0, rss: map[string]float64{"r1": 30, "r2": 31}},
		{at: at(250), streamLen: 2, rss: map[string]float64{"r1": 33, "r2": 32}},
		{at: at(380), streamLen: -1, rss: map[string]float64{"r1": 31, "r2": 32}},
	}
	var res Result
	queueTimeline(t0, accepted, outcomes, samples, &res)
	want := []QueueSlice{
		{AtS: 0, Accepted: 1, StreamLen: 0, RSSMB: 31},
		{AtS: 0.1, Accepted: 2, StreamLen: -1, RSSMB: -1},
		{AtS: 0.2, Confirmed: 2, StreamLen: 2, RSSMB: 33},
		{AtS: 0.3, Accepted: 1, Rejected: 1, StreamLen: -1, RSSMB: 32},
		{AtS: 0.4, Confirmed: 1, StreamLen: -1, RSSMB: -1},
	}
	if len(res.QueueTimeline) != len(want) {
		t.Fatalf("timeline %+v, want %+v", res.QueueTimeline, want)
	}
	for i := range want {
		if res.QueueTimeline[i] != want[i] {
			t.Errorf("slice %d: %+v, want %+v", i, res.QueueTimeline[i], want[i])
		}
	}
	if res.SettledRPS != 10 { // 4 outcomes, the last 400 ms after the first request
		t.Errorf("settled_rps %v, want 10", res.SettledRPS)
	}
	if res.StreamLenMax == nil || *res.StreamLenMax != 2 {
		t.Errorf("stream_len_max %v, want 2", res.StreamLenMax)
	}
	if res.ReplicaRSSStartMB["r1"] != 30 || res.ReplicaRSSEndMB["r1"] != 31 || res.ReplicaRSSEndMB["r2"] != 32 {
		t.Errorf("rss start %v end %v, want r1 30 -> 31, r2 -> 32", res.ReplicaRSSStartMB, res.ReplicaRSSEndMB)
	}
}
