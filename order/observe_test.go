package order_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/order"
)

// stepLog records every step the flow tells an observer, in order.
type stepLog struct {
	mu    sync.Mutex
	steps []order.HookPoint
}

func (l *stepLog) Observe(_ context.Context, e order.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.steps = append(l.steps, e.At)
}

func (l *stepLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.steps)
}

// TestObserverEachStepOnce: an order and a hold tell the observers each
// step once, in the flow's order, and the log observer writes one write
// record per order batch and one lease record per lease.
func TestObserverEachStepOnce(t *testing.T) {
	f := newFixture(t)
	f.stock("obs", 5)
	steps := &stepLog{}
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	svc := f.service(local.New(), order.Config{Instance: "obs", Lock: "local", Logger: log, Observers: []order.Observer{steps}})

	if rec := post(svc.Handler(), "obs", 1); rec.Code != 201 {
		t.Fatalf("POST = %d %s", rec.Code, rec.Body)
	}
	want := "[acquired after-read before-write before-commit written before-cache after-commit released]"
	if got := steps.String(); got != want {
		t.Errorf("order steps %s, want %s", got, want)
	}
	if n := strings.Count(logs.String(), `"msg":"write"`); n != 1 {
		t.Errorf("%d write records, want 1:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), `"msg":"lease"`); n != 1 {
		t.Errorf("%d lease records, want 1:\n%s", n, logs.String())
	}

	steps.steps = nil
	if _, _, err := svc.Hold(context.Background(), order.HoldRequest{Lines: []order.Line{{SKU: "obs", Quantity: 1}}}); err != nil {
		t.Fatal(err)
	}
	want = "[acquired reservation-written hold-after-commit released]"
	if got := steps.String(); got != want {
		t.Errorf("hold steps %s, want %s", got, want)
	}
	if n := strings.Count(logs.String(), `"msg":"write"`); n != 1 {
		t.Errorf("%d write records after the hold, want 1 (holds draw none)", n)
	}
}
