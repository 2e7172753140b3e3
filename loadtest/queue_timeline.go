package loadtest

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/inventory"
)

// A queue run's backlog over time: when each order was answered 202 and
// when MySQL took its outcome, in slices, beside what the lab sampled
// meanwhile (the stream's length, each replica's resident memory). The
// report draws it: the gap between accepted and settled is the backlog a
// customer waits behind.

// QueueSlice is one slice of a queue run, from the first request sent:
// the orders answered 202 in it, the outcomes MySQL took in it (by
// settled_at), and the largest stream length (XLEN) and replica resident
// set (VmRSS, MiB) sampled in it (-1: no sample fell in it).
type QueueSlice struct {
	AtS       float64 `json:"t_s"`
	Accepted  int     `json:"accepted"`
	Confirmed int     `json:"confirmed"`
	Rejected  int     `json:"rejected"`
	StreamLen int64   `json:"stream_len"`
	RSSMB     float64 `json:"rss_mb"`
}

// queueSample is one look at the queue while a run loads and drains.
type queueSample struct {
	at        time.Time
	streamLen int64              // -1: not read
	rss       map[string]float64 // VmRSS in MiB by replica
}

// queueSampleEvery is how often the lab looks at the stream and the
// replicas' memory during a queue run.
const queueSampleEvery = 250 * time.Millisecond

// watchQueue samples the stream's length and the replicas' resident memory
// until the returned stop is called, which returns the samples.
func (rn *Runner) watchQueue(ctx context.Context, run *Run) (stop func() []queueSample) {
	ctx, cancel := context.WithCancel(ctx)
	var identity string
	_ = rn.DB.QueryRowContext(ctx, "SELECT value FROM meta WHERE name = 'database_identity'").Scan(&identity)
	var q *inventory.Queue
	rdb, err := redisconn.Open(run.Servers.RedisAddr)
	if err == nil && identity != "" {
		q = inventory.NewGate(rdb, "oversold:", identity).Queue()
	}
	var (
		mu      sync.Mutex
		samples []queueSample
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		tick := time.NewTicker(queueSampleEvery)
		defer tick.Stop()
		for {
			s := queueSample{at: time.Now(), streamLen: -1}
			if q != nil {
				lctx, lcancel := context.WithTimeout(ctx, time.Second)
				if n, err := q.Len(lctx); err == nil {
					s.streamLen = n
				}
				lcancel()
			}
			if run.Fleet != nil {
				s.rss = run.Fleet.RSS()
			}
			mu.Lock()
			samples = append(samples, s)
			mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() []queueSample {
		cancel()
		<-done
		if rdb != nil {
			rdb.Close()
		}
		mu.Lock()
		defer mu.Unlock()
		return samples
	}
}

// RSS reads each running replica's resident set size now (VmRSS), in MiB,
// by replica name; a replica whose figure cannot be read is left out.
func (f *Fleet) RSS() map[string]float64 {
	out := map[string]float64{}
	for _, r := range f.Replicas {
		if pid := r.Pid(); pid != 0 {
			if kib, ok := statusKiB(readFile("/proc/"+strconv.Itoa(pid)+"/status"), "VmRSS"); ok {
				out[r.Name] = round(float64(kib) / 1024)
			}
		}
	}
	return out
}

// queueSlices is about how many slices a queue run's timeline has.
const queueSlices = 40

// queueTimeline cuts a queue run, from start (its first request sent) to
// its last 202, outcome or sample, into slices, and records in res the
// timeline, the rate of outcomes (SettledRPS), the stream's longest
// sampled length and each replica's memory at the first and last sample.
func queueTimeline(start time.Time, accepted []Accepted, outcomes map[string]queueOutcome, samples []queueSample, res *Result) {
	end := start
	for _, a := range accepted {
		end = maxTime(end, a.At)
	}
	var lastOutcome time.Time
	for _, o := range outcomes {
		end, lastOutcome = maxTime(end, o.settled), maxTime(lastOutcome, o.settled)
	}
	for _, s := range samples {
		end = maxTime(end, s.at)
	}
	if len(outcomes) > 0 && lastOutcome.After(start) {
		res.SettledRPS = round(float64(len(outcomes)) / lastOutcome.Sub(start).Seconds())
	}
	width := max(end.Sub(start)/queueSlices, 100*time.Millisecond).Round(100 * time.Millisecond)
	n := int(end.Sub(start)/width) + 1
	out := make([]QueueSlice, n)
	for i := range out {
		out[i] = QueueSlice{AtS: round(float64(i) * width.Seconds()), StreamLen: -1, RSSMB: -1}
	}
	slot := func(t time.Time) *QueueSlice {
		return &out[min(max(int(t.Sub(start)/width), 0), n-1)]
	}
	for _, a := range accepted {
		slot(a.At).Accepted++
	}
	for _, o := range outcomes {
		if o.status == "rejected" {
			slot(o.settled).Rejected++
		} else {
			slot(o.settled).Confirmed++
		}
	}
	var maxLen int64 = -1
	for i, s := range samples {
		sl := slot(s.at)
		sl.StreamLen, maxLen = max(sl.StreamLen, s.streamLen), max(maxLen, s.streamLen)
		for _, mb := range s.rss {
			sl.RSSMB = math.Max(sl.RSSMB, mb)
		}
		if len(s.rss) > 0 && res.ReplicaRSSStartMB == nil {
			res.ReplicaRSSStartMB = s.rss
		}
		if len(s.rss) > 0 && i > 0 {
			res.ReplicaRSSEndMB = s.rss
		}
	}
	if maxLen >= 0 {
		res.StreamLenMax = &maxLen
	}
	res.QueueTimeline = out
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// firstSent is when the attack's first request was sent.
func firstSent(answers []Answer) time.Time {
	var t time.Time
	for _, a := range answers {
		if t.IsZero() || a.Sent.Before(t) {
			t = a.Sent
		}
	}
	return t
}
