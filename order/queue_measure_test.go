package order_test

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// TestQueueConsumerCapacity measures the consumers alone, apart from the
// accept side: it fills the stream with OVERSOLD_MEASURE_QUEUE orders
// (accepted with no consumer running), then starts three replicas' consumers
// (OVERSOLD_MEASURE_WORK_DELAY of work per order, 0 unless given) and
// reports how fast they settle the backlog. A measurement, not a check:
// it runs only when asked, and asserts nothing about time.
//
//	OVERSOLD_MEASURE_QUEUE=6000 go test ./order/ -run TestQueueConsumerCapacity -v
func TestQueueConsumerCapacity(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("OVERSOLD_MEASURE_QUEUE"))
	if n <= 0 {
		t.Skip("a measurement: set OVERSOLD_MEASURE_QUEUE to the orders to queue")
	}
	workDelay, _ := time.ParseDuration(os.Getenv("OVERSOLD_MEASURE_WORK_DELAY"))
	f := newFixture(t)
	f.stock("q-measure", int64(n))
	g := f.gate()
	front := f.service(nil, order.Config{Guard: storage.GuardAtomic, Gate: g, Queue: g.Queue()}).Handler()
	if err := g.Queue().Group(t.Context()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				if rec := post(front, "q-measure", 1); rec.Code != http.StatusAccepted {
					t.Errorf("status %d body %s, want 202", rec.Code, rec.Body)
					return
				}
			}
		})
	}
	wg.Wait()
	t0 := time.Now()
	for i := range 3 {
		f.queueReplica(nil, order.Config{Instance: fmt.Sprint("c", i+1), Guard: storage.GuardAtomic, WorkDelay: workDelay})
	}
	for f.queueLen() > 0 {
		time.Sleep(10 * time.Millisecond)
	}
	d := time.Since(t0)
	a := f.audit("q-measure")
	t.Logf("%d orders settled by 3 consumers, work delay %v, in %v: %.0f/s; MySQL holds %d orders, stock %d", n, workDelay, d.Round(time.Millisecond), float64(n)/d.Seconds(), a.Orders, a.Stock)
}
