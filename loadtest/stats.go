package loadtest

import (
	"math"
	"slices"
	"time"
)

// percentile returns the nearest-rank q-quantile (0 < q <= 1) of d, which it
// sorts in place: the smallest value with at least q of all values at or
// below it.
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	rank := int(math.Ceil(q*float64(len(d)))) - 1
	return d[min(max(rank, 0), len(d)-1)]
}

// ms is d in milliseconds, rounded to a hundredth.
func ms(d time.Duration) float64 { return round(float64(d) / float64(time.Millisecond)) }

// round keeps two decimals: enough for milliseconds and rates.
func round(f float64) float64 { return math.Round(f*100) / 100 }
