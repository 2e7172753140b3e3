package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// AttackSpec is a bounded load: Requests orders at Rate per second, never more
// than Workers in flight, each for quantity 1 of the next SKU in turn and with
// its own Idempotency-Key.
type AttackSpec struct {
	Target    string   // base URL of the service, e.g. http://127.0.0.1:41234
	SKUs      []string // ordered round-robin
	Requests  int
	Rate      int // requests per second
	Workers   int
	Timeout   time.Duration // per request; 0 means 10s
	KeyPrefix string        // keys are KeyPrefix-000001...: unique per run, or orders replay
	// Path, if set, makes every request a GET of it instead of an order
	// (the ceiling run's /healthz); SKUs and KeyPrefix are then unused.
	Path string

	// Progress, if set, hears the number of requests finished so far, after
	// each one, from a single goroutine.
	Progress func(done int)
}

// AttackResult is what the client saw.
//
// Throughput is answers per second: requests that got an HTTP answer, any
// status, divided by Duration, the span from the first request sent to the
// last answer received. It cannot exceed the offered rate; when it is lower,
// the service fell behind. Latency covers the same answered requests.
type AttackResult struct {
	Requests   int
	Status     map[string]int // HTTP status code -> answers
	NoResponse int            // no HTTP answer: timeout, refused, reset
	FirstError string         // the first transport error, for the report
	Duration   time.Duration
	Throughput float64
	Latency    Latency
	OverTime   []Slice
	OrderIDs   []string   // the id of every order acknowledged with 201
	Accepted   []Accepted // every order accepted with 202 (accept queue)
	Answers    []Answer   // every request, answered (Code > 0) or not, in the order they ended
}

// Answer is one request: which SKU, what status and error code, when it
// was sent and ended, and the replica that served it (the balancer's
// ReplicaHeader); Code is 0 when no HTTP answer came.
type Answer struct {
	SKU     string
	Code    int
	Error   string // the API error code of a 4xx or 5xx
	Replica string
	Sent    time.Time
	End     time.Time
}

// sample is one finished request, kept until the attack ends.
type sample struct {
	sent    time.Time
	latency time.Duration
	code    int
}

// Attack runs spec against its target and returns what came back. It ends
// when every request is answered or timed out, or when ctx is done.
func Attack(ctx context.Context, spec AttackSpec) (*AttackResult, error) {
	switch {
	case spec.Target == "":
		return nil, errors.New("attack: no target")
	case len(spec.SKUs) == 0 && spec.Path == "":
		return nil, errors.New("attack: no SKUs")
	case spec.Requests <= 0 || spec.Rate <= 0 || spec.Workers <= 0:
		return nil, fmt.Errorf("attack: requests, rate and workers must be positive (%d, %d, %d)",
			spec.Requests, spec.Rate, spec.Workers)
	}
	timeout := spec.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	client := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			MaxIdleConns:        spec.Workers,
			MaxIdleConnsPerHost: spec.Workers,
			IdleConnTimeout:     30 * time.Second,
		},
	}
	defer client.CloseIdleConnections()

	// A fixed pool of workers: vegeta would otherwise add workers without
	// bound whenever all are busy, and the contention would no longer be
	// what --workers says.
	attacker := vegeta.NewAttacker(
		vegeta.Client(client),
		vegeta.Workers(uint64(spec.Workers)),
		vegeta.MaxWorkers(uint64(spec.Workers)),
	)
	pacer := countedPacer{
		Pacer: vegeta.ConstantPacer{Freq: spec.Rate, Per: time.Second},
		limit: uint64(spec.Requests),
	}
	targeter := orderTargeter(spec)
	if spec.Path != "" {
		targeter = getTargeter(spec.Target + spec.Path)
	}
	results := attacker.Attack(targeter, pacer, 0, "oversold")

	stop := context.AfterFunc(ctx, func() { attacker.Stop() })
	defer stop()

	out := &AttackResult{Status: map[string]int{}}
	samples := make([]sample, 0, spec.Requests)
	for res := range results {
		out.Requests++
		a := Answer{SKU: skuOf(spec.SKUs, res.URL), Code: int(res.Code), Sent: res.Timestamp, End: res.End(), Replica: res.Headers.Get(ReplicaHeader)}
		if res.Code >= 400 {
			a.Error = errorCode(res.Body)
		}
		out.Answers = append(out.Answers, a)
		if res.Code == 0 {
			out.NoResponse++
			if out.FirstError == "" {
				out.FirstError = res.Error
			}
		} else {
			out.Status[strconv.Itoa(int(res.Code))]++
			samples = append(samples, sample{sent: res.Timestamp, latency: res.Latency, code: int(res.Code)})
			if res.Code == http.StatusCreated {
				out.OrderIDs = append(out.OrderIDs, orderID(res.Body))
			}
			if res.Code == http.StatusAccepted {
				out.Accepted = append(out.Accepted, Accepted{ID: orderID(res.Body), At: res.End()})
			}
		}
		if spec.Progress != nil {
			spec.Progress(out.Requests)
		}
	}
	out.summarise(samples)
	if err := ctx.Err(); err != nil {
		return out, fmt.Errorf("attack stopped after %d of %d requests: %w", out.Requests, spec.Requests, err)
	}
	return out, nil
}

// countedPacer paces like its Pacer and stops after limit hits.
type countedPacer struct {
	vegeta.Pacer
	limit uint64
}

func (p countedPacer) Pace(elapsed time.Duration, hits uint64) (time.Duration, bool) {
	if hits >= p.limit {
		return 0, true
	}
	return p.Pacer.Pace(elapsed, hits)
}

// orderTargeter builds each request afresh: the next SKU in turn and a new
// Idempotency-Key. Workers call it concurrently.
func orderTargeter(spec AttackSpec) vegeta.Targeter {
	url := spec.Target + "/v1/orders"
	bodies := make([][]byte, len(spec.SKUs))
	for i, sku := range spec.SKUs {
		bodies[i], _ = json.Marshal(map[string]any{"sku": sku, "quantity": 1})
	}
	var seq atomic.Uint64
	return func(t *vegeta.Target) error {
		n := seq.Add(1)
		t.Method = http.MethodPost
		// The fragment never leaves the client: it tags the result with
		// the request's number, hence its SKU (see skuOf).
		t.URL = url + "#" + strconv.FormatUint(n, 10)
		t.Body = bodies[(n-1)%uint64(len(bodies))]
		t.Header = http.Header{
			"Content-Type":    {"application/json"},
			"Idempotency-Key": {fmt.Sprintf("%s-%06d", spec.KeyPrefix, n)},
		}
		return nil
	}
}

// getTargeter GETs url, numbered as orderTargeter numbers orders.
func getTargeter(url string) vegeta.Targeter {
	var seq atomic.Uint64
	return func(t *vegeta.Target) error {
		t.Method = http.MethodGet
		t.URL = url + "#" + strconv.FormatUint(seq.Add(1), 10)
		return nil
	}
}

// skuOf is the SKU of the request whose target URL was u.
func skuOf(skus []string, u string) string {
	_, frag, _ := strings.Cut(u, "#")
	n, err := strconv.ParseUint(frag, 10, 64)
	if err != nil || n == 0 || len(skus) == 0 {
		return ""
	}
	return skus[(n-1)%uint64(len(skus))]
}

// orderID reads the id of an order from a 201 body; ids may be numbers or
// strings. A body without one yields "", which no order in MySQL matches.
func orderID(body []byte) string {
	var o struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(body, &o) != nil || len(o.ID) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(o.ID, &s) == nil {
		return s
	}
	return string(o.ID)
}

// summarise fills the duration, throughput, latency and time slices.
func (r *AttackResult) summarise(samples []sample) {
	if len(samples) == 0 {
		return
	}
	first, last := samples[0].sent, samples[0].sent.Add(samples[0].latency)
	lat := make([]time.Duration, len(samples))
	for i, s := range samples {
		if s.sent.Before(first) {
			first = s.sent
		}
		if end := s.sent.Add(s.latency); end.After(last) {
			last = end
		}
		lat[i] = s.latency
	}
	r.Duration = last.Sub(first)
	if r.Duration > 0 {
		r.Throughput = float64(len(samples)) / r.Duration.Seconds()
	}
	r.Latency = Latency{
		P50: ms(percentile(lat, 0.50)),
		P90: ms(percentile(lat, 0.90)),
		P99: ms(percentile(lat, 0.99)),
		Max: ms(percentile(lat, 1)),
	}
	r.OverTime = timeSlices(samples, first, r.Duration)
}

// overTimeSlices is about how many slices an attack is cut into for the
// latency-over-time chart.
const overTimeSlices = 30

func timeSlices(samples []sample, first time.Time, span time.Duration) []Slice {
	width := max(span/overTimeSlices, 10*time.Millisecond).Round(time.Millisecond)
	byIndex := map[int][]sample{}
	last := 0
	for _, s := range samples {
		i := int(s.sent.Sub(first) / width)
		byIndex[i] = append(byIndex[i], s)
		last = max(last, i)
	}
	var out []Slice
	for i := 0; i <= last; i++ {
		in := byIndex[i]
		if len(in) == 0 {
			continue
		}
		lat := make([]time.Duration, len(in))
		sl := Slice{At: round(float64(i) * width.Seconds()), Requests: len(in)}
		for j, s := range in {
			lat[j] = s.latency
			if s.code == http.StatusCreated {
				sl.Created++
			}
		}
		sl.P50, sl.P99 = ms(percentile(lat, 0.50)), ms(percentile(lat, 0.99))
		out = append(out, sl)
	}
	return out
}
