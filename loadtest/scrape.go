package loadtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The replica metrics the lab reads (docs/design.md, orderd's /metrics).
const (
	metricLockWait   = "oversold_lock_wait_seconds"
	metricLockHold   = "oversold_lock_hold_seconds"
	metricConflicts  = "oversold_guard_conflicts_total"
	metricLeasesLost = "oversold_lock_leases_lost_total"
)

// ReplicaMetrics is what the replicas say about their locks and guards,
// summed over all of them.
type ReplicaMetrics struct {
	LockWait   *Wait // nil when no replica waited for a lock (lock none)
	LockHold   *Wait
	Conflicts  int // writes the guard refused
	LeasesLost int
}

// Scrape reads /metrics from every replica and merges them. Counters count
// since each replica started, so scrape a fresh fleet once, after the load.
func Scrape(ctx context.Context, replicas []string) (ReplicaMetrics, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	wait, hold := &histogram{}, &histogram{}
	var out ReplicaMetrics
	var errs []error
	for _, base := range replicas {
		families, err := scrapeOne(ctx, client, base+"/metrics")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		wait.add(families[metricLockWait])
		hold.add(families[metricLockHold])
		out.Conflicts += int(counterSum(families[metricConflicts]))
		out.LeasesLost += int(counterSum(families[metricLeasesLost]))
	}
	out.LockWait, out.LockHold = wait.summary(), hold.summary()
	return out, errors.Join(errs...)
}

func scrapeOne(ctx context.Context, client *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain") // the text format: no protobuf negotiation
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return families, nil
}

func counterSum(f *dto.MetricFamily) float64 {
	var sum float64
	for _, m := range f.GetMetric() {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// histogram merges Prometheus histograms (every series of a family, every
// replica) that share bucket bounds.
type histogram struct {
	count   uint64
	sum     float64
	buckets map[float64]uint64 // upper bound -> cumulative count
}

func (h *histogram) add(f *dto.MetricFamily) {
	for _, m := range f.GetMetric() {
		hist := m.GetHistogram()
		if hist == nil {
			continue
		}
		if h.buckets == nil {
			h.buckets = map[float64]uint64{}
		}
		h.count += hist.GetSampleCount()
		h.sum += hist.GetSampleSum()
		for _, b := range hist.GetBucket() {
			h.buckets[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
}

// summary is the merged histogram in milliseconds, or nil when it is empty.
func (h *histogram) summary() *Wait {
	if h.count == 0 {
		return nil
	}
	return &Wait{
		Count: int64(h.count),
		Mean:  round(h.sum / float64(h.count) * 1000),
		P50:   round(h.quantile(0.50) * 1000),
		P99:   round(h.quantile(0.99) * 1000),
	}
}

// quantile interpolates linearly inside the bucket holding rank q*count, as
// PromQL's histogram_quantile does; in the +Inf bucket it answers the highest
// finite bound.
func (h *histogram) quantile(q float64) float64 {
	bounds := make([]float64, 0, len(h.buckets)+1)
	for b := range h.buckets {
		bounds = append(bounds, b)
	}
	if _, ok := h.buckets[math.Inf(1)]; !ok {
		bounds = append(bounds, math.Inf(1))
		h.buckets[math.Inf(1)] = h.count
	}
	slices.Sort(bounds)
	rank := q * float64(h.count)
	lower, below := 0.0, uint64(0)
	for _, upper := range bounds {
		cum := h.buckets[upper]
		if float64(cum) >= rank {
			if math.IsInf(upper, 1) {
				return lower
			}
			if cum == below {
				return upper
			}
			return lower + (upper-lower)*(rank-float64(below))/float64(cum-below)
		}
		lower, below = upper, cum
	}
	return lower
}
