package loadtest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// replicaMetrics is what one replica's /metrics might say after a run.
func replicaMetrics(replica string, waits [4]int, conflicts int) string {
	return fmt.Sprintf(`# HELP oversold_lock_wait_seconds Time spent waiting for a lock.
# TYPE oversold_lock_wait_seconds histogram
oversold_lock_wait_seconds_bucket{lock="redis",replica="%[1]s",le="0.001"} %[2]d
oversold_lock_wait_seconds_bucket{lock="redis",replica="%[1]s",le="0.01"} %[3]d
oversold_lock_wait_seconds_bucket{lock="redis",replica="%[1]s",le="0.1"} %[4]d
oversold_lock_wait_seconds_bucket{lock="redis",replica="%[1]s",le="+Inf"} %[5]d
oversold_lock_wait_seconds_sum{lock="redis",replica="%[1]s"} 0.5
oversold_lock_wait_seconds_count{lock="redis",replica="%[1]s"} %[5]d
# HELP oversold_guard_conflicts_total Writes the guard refused.
# TYPE oversold_guard_conflicts_total counter
oversold_guard_conflicts_total{guard="version",replica="%[1]s"} %[6]d
# HELP oversold_lock_leases_lost_total Leases lost.
# TYPE oversold_lock_leases_lost_total counter
oversold_lock_leases_lost_total{lock="redis",replica="%[1]s"} 1
`, replica, waits[0], waits[1], waits[2], waits[3], conflicts)
}

func TestScrape(t *testing.T) {
	var urls []string
	for _, body := range []string{
		replicaMetrics("r1", [4]int{50, 90, 100, 100}, 3),
		replicaMetrics("r2", [4]int{50, 90, 100, 100}, 4),
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			fmt.Fprint(w, body)
		}))
		defer srv.Close()
		urls = append(urls, srv.URL)
	}
	m, err := Scrape(t.Context(), urls)
	if err != nil {
		t.Fatal(err)
	}
	if m.Conflicts != 7 || m.LeasesLost != 2 {
		t.Errorf("conflicts %d, leases lost %d; want 7, 2", m.Conflicts, m.LeasesLost)
	}
	w := m.LockWait
	// 200 waits: 100 under 1ms, 80 in (1ms, 10ms], 20 in (10ms, 100ms].
	// p50 = rank 100, the top of the first bucket; p99 = rank 198, 18/20
	// of the way through the third.
	if w == nil || w.Count != 200 || w.Mean != 5 || w.P50 != 1 || w.P99 != 91 {
		t.Errorf("lock wait %+v, want count 200, mean 5, p50 1, p99 91", w)
	}
	if m.LockHold != nil {
		t.Errorf("lock hold %+v from replicas that have no such metric", m.LockHold)
	}
}

func TestScrapeUnreachableReplica(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	if _, err := Scrape(t.Context(), []string{url}); err == nil {
		t.Error("no error from a replica that does not answer")
	}
}
