package order_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// burst sends n orders of quantity 1 for sku at once, from a closed
// channel (the start barrier), spread round-robin over the handlers.
func burst(hs []http.Handler, sku string, n int, header ...string) []*httptest.ResponseRecorder {
	recs := make([]*httptest.ResponseRecorder, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			recs[i] = post(hs[i%len(hs)], sku, 1, header...)
		})
	}
	close(start)
	wg.Wait()
	return recs
}

// TestIdempotencyUnderConcurrency: 20 requests with one key at once make
// one order and one decrement, and all 20 answers carry its id: one 201,
// nineteen 200. The UNIQUE index decides, whatever the lock and guard.
func TestIdempotencyUnderConcurrency(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, c := range []struct {
		lock  string
		guard storage.Guard
	}{
		{"local", storage.GuardVersion},
		{"none", storage.GuardNone},
		{"none", storage.GuardVersion},
		{"none", storage.GuardAtomic},
		{"local", storage.GuardNone},
	} {
		// With one unit, the tries that lose the race for it must still
		// find their order, not out_of_stock.
		for _, stock := range []int64{100, 1} {
			t.Run(fmt.Sprintf("%s/%s/stock-%d", c.lock, c.guard, stock), func(t *testing.T) {
				sku := fmt.Sprintf("idem-%s-%s-%d", c.lock, c.guard, stock)
				f.stock(sku, stock)
				var locker order.Locker
				if c.lock == "local" {
					locker = local.New()
				}
				h := f.service(locker, order.Config{Lock: c.lock, Guard: c.guard}).Handler()
				recs := burst([]http.Handler{h}, sku, 20, "Idempotency-Key", "key-"+sku)

				codes := map[int]int{}
				ids := map[string]bool{}
				for _, r := range recs {
					codes[r.Code]++
					if r.Code < 300 {
						ids[decodeOrder(t, r).ID] = true
					} else {
						t.Errorf("answer %d %s", r.Code, r.Body)
					}
				}
				if codes[201] != 1 || codes[200] != 19 || len(ids) != 1 {
					t.Errorf("statuses %v, %d distinct ids; want one 201, nineteen 200, one id", codes, len(ids))
				}
				if a := f.audit(sku); a.Orders != 1 || a.Ordered != 1 || a.Stock != stock-1 || a.DuplicateKeys != 0 {
					t.Errorf("MySQL %+v, want one order and one decrement (stock %d)", a, stock-1)
				}
			})
		}
	}
}

// TestOversell is the point of the project, in miniature: three replicas,
// each with its own in-process lock, share one MariaDB and one Redis. 120
// orders of one unit arrive at once for a SKU with 20 in stock, with 5ms of
// work inside the critical section. The invariants are computed from MySQL
// as docs/design.md defines them.
func TestOversell(t *testing.T) {
	t.Parallel()
	const (
		initial  = 20
		requests = 120
		replicas = 3
	)
	f := newFixture(t)
	for _, c := range []struct {
		lock  string
		guard storage.Guard
		safe  bool
	}{
		{"local", storage.GuardNone, false},   // a per-process lock alone: oversells
		{"local", storage.GuardVersion, true}, // the version guard catches what the lock misses
		{"none", storage.GuardAtomic, true},   // no lock at all: the lock-free ceiling
	} {
		t.Run(c.lock+"/"+string(c.guard), func(t *testing.T) {
			sku := "hot-" + c.lock + "-" + string(c.guard)
			f.stock(sku, initial)
			hs := make([]http.Handler, replicas)
			for i := range hs {
				var locker order.Locker
				if c.lock == "local" {
					locker = local.New() // its own: the replicas do not share it
				}
				hs[i] = f.service(locker, order.Config{
					Instance: fmt.Sprintf("r%d", i+1), Lock: c.lock, Guard: c.guard,
					WorkDelay: 5 * time.Millisecond, LockWait: time.Minute,
				}).Handler()
			}
			begin := time.Now()
			recs := burst(hs, sku, requests)
			elapsed := time.Since(begin)

			status := map[int]int{}
			var acked []string
			for _, r := range recs {
				status[r.Code]++
				if r.Code == http.StatusCreated {
					acked = append(acked, decodeOrder(t, r).ID)
				} else if r.Code != http.StatusConflict {
					t.Errorf("unexpected answer %d %s", r.Code, r.Body)
				}
			}
			a := f.audit(sku)
			oversold := max(0, a.Ordered-initial)
			lostUpdates := abs(initial - a.Stock - a.Ordered)
			lostAcks := 0
			for _, id := range acked {
				if _, err := f.store.Order(t.Context(), id); err != nil {
					lostAcks++
				}
			}
			t.Logf("%s: status %v, final stock %d, ordered %d, oversold %d, lost updates %d, lost acks %d, in %v",
				t.Name(), status, a.Stock, a.Ordered, oversold, lostUpdates, lostAcks, elapsed.Round(time.Millisecond))

			if lostAcks != 0 || a.Orders != int64(len(acked)) {
				t.Errorf("%d acknowledged orders missing from MySQL, %d orders for %d acks", lostAcks, a.Orders, len(acked))
			}
			if !c.safe {
				if oversold == 0 && lostUpdates == 0 {
					t.Errorf("guard none behind per-process locks: want oversell or a lost update, saw neither")
				}
				return
			}
			if a.Ordered != initial || a.Stock != 0 || oversold != 0 || lostUpdates != 0 {
				t.Errorf("want exactly %d sold, stock 0, nothing lost", initial)
			}
			if status[http.StatusCreated] != initial {
				t.Errorf("%d answered 201, want %d", status[http.StatusCreated], initial)
			}
		})
	}
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
