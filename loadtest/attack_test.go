package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// shop is a tiny stand-in for orderd: it sells stock units of any SKU, one per
// request, and records what it was sent.
type shop struct {
	mu    sync.Mutex
	stock map[string]int
	keys  map[string]int // Idempotency-Key -> times seen
	ids   atomic.Int64
	bad   []string // problems with requests, reported by the test
}

func newShop(stock int, skus ...string) *shop {
	s := &shop{stock: map[string]int{}, keys: map[string]int{}}
	for _, sku := range skus {
		s.stock[sku] = stock
	}
	return s
}

func (s *shop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		SKU      string `json:"sku"`
		Quantity int    `json:"quantity"`
	}
	err := json.NewDecoder(r.Body).Decode(&body)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case r.Method != http.MethodPost || r.URL.Path != "/v1/orders":
		s.bad = append(s.bad, r.Method+" "+r.URL.Path)
	case r.Header.Get("Content-Type") != "application/json":
		s.bad = append(s.bad, "content type "+r.Header.Get("Content-Type"))
	case err != nil || body.Quantity != 1:
		s.bad = append(s.bad, fmt.Sprintf("body %+v: %v", body, err))
	}
	s.keys[r.Header.Get("Idempotency-Key")]++
	if s.stock[body.SKU] < body.Quantity {
		w.WriteHeader(http.StatusConflict)
		fmt.Fprint(w, `{"error":{"code":"out_of_stock","message":"sold out"}}`)
		return
	}
	s.stock[body.SKU] -= body.Quantity
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"sku":%q,"quantity":1,"status":"placed"}`, s.ids.Add(1), body.SKU)
}

func TestAttack(t *testing.T) {
	s := newShop(10, "a", "b")
	srv := httptest.NewServer(s)
	defer srv.Close()

	var progress []int
	res, err := Attack(t.Context(), AttackSpec{
		Target:    srv.URL,
		SKUs:      []string{"a", "b"},
		Requests:  50,
		Rate:      500,
		Workers:   8,
		KeyPrefix: "run1",
		Progress:  func(done int) { progress = append(progress, done) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.bad) > 0 {
		t.Errorf("malformed requests: %q", s.bad)
	}
	if res.Requests != 50 || res.Status["201"] != 20 || res.Status["409"] != 30 || res.NoResponse != 0 {
		t.Errorf("requests %d, status %v, no response %d; want 50, 201×20 409×30, 0",
			res.Requests, res.Status, res.NoResponse)
	}
	if s.stock["a"] != 0 || s.stock["b"] != 0 {
		t.Errorf("stock left %v: SKUs were not ordered round-robin", s.stock)
	}
	if len(s.keys) != 50 {
		t.Errorf("%d distinct Idempotency-Keys for 50 requests", len(s.keys))
	}
	if len(res.OrderIDs) != 20 || res.OrderIDs[0] == "" {
		t.Errorf("order ids %q: want 20 non-empty", res.OrderIDs)
	}
	if len(progress) != 50 || progress[49] != 50 {
		t.Errorf("progress heard %d times, last %v", len(progress), progress[len(progress)-1:])
	}
	// 50 requests at 500/s take about 0.1 s.
	if res.Duration <= 0 || res.Duration > 2*time.Second || res.Throughput <= 0 {
		t.Errorf("duration %v, throughput %.1f", res.Duration, res.Throughput)
	}
	l := res.Latency
	if !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max) {
		t.Errorf("latency percentiles out of order: %+v", l)
	}
	total := 0
	for _, sl := range res.OverTime {
		total += sl.Requests
	}
	if total != 50 || len(res.OverTime) < 2 {
		t.Errorf("time slices %+v hold %d requests, want 50 in several slices", res.OverTime, total)
	}
}

func TestAttackUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now

	res, err := Attack(t.Context(), AttackSpec{Target: url, SKUs: []string{"a"}, Requests: 5, Rate: 100, Workers: 2, KeyPrefix: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if res.NoResponse != 5 || res.FirstError == "" || len(res.Status) != 0 {
		t.Errorf("no response %d, first error %q, status %v: want 5 transport errors", res.NoResponse, res.FirstError, res.Status)
	}
}

func TestAttackStopsWithContext(t *testing.T) {
	srv := httptest.NewServer(newShop(1000, "a"))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	res, err := Attack(ctx, AttackSpec{Target: srv.URL, SKUs: []string{"a"}, Requests: 1000, Rate: 100, Workers: 2, KeyPrefix: "x"})
	if err == nil {
		t.Fatal("attack outlived its context")
	}
	if res == nil || res.Requests == 0 || res.Requests >= 1000 {
		t.Fatalf("got %+v, want a partial result", res)
	}
}

func TestOrderID(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"id":42,"sku":"a"}`, "42"},
		{`{"id":"0193f-abc"}`, "0193f-abc"},
		{`{"sku":"a"}`, ""},
		{`not json`, ""},
	} {
		if got := orderID([]byte(tc.body)); got != tc.want {
			t.Errorf("orderID(%s) = %q, want %q", tc.body, got, tc.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	d := make([]time.Duration, 100)
	for i := range d {
		d[i] = time.Duration(100-i) * time.Millisecond // 100ms..1ms, unsorted
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.9, 90 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}} {
		if got := percentile(d, tc.q); got != tc.want {
			t.Errorf("percentile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile of nothing = %v", got)
	}
}
