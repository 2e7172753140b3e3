package order_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// hold posts a hold of lines (sku, quantity, sku, quantity, ...).
func hold(h http.Handler, ttl int, key string, lines ...any) *httptest.ResponseRecorder {
	var ls []map[string]any
	for i := 0; i+1 < len(lines); i += 2 {
		ls = append(ls, map[string]any{"sku": lines[i], "quantity": lines[i+1]})
	}
	body := map[string]any{"lines": ls}
	if ttl > 0 {
		body["ttl_seconds"] = ttl
	}
	b, _ := json.Marshal(body)
	var header []string
	if key != "" {
		header = []string{"Idempotency-Key", key}
	}
	return call(h, http.MethodPost, "/v1/reservations", string(b), header...)
}

func settle(h http.Handler, id, op string) *httptest.ResponseRecorder {
	return call(h, http.MethodPost, "/v1/reservations/"+id+"/"+op, "")
}

func decodeReservation(t *testing.T, rec *httptest.ResponseRecorder) order.Reservation {
	t.Helper()
	var r order.Reservation
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || r.ID == "" {
		t.Fatalf("status %d body %q: not a reservation (%v)", rec.Code, rec.Body, err)
	}
	return r
}

// inv is a SKU's row as GET /v1/inventory/{sku} shows it.
type inv struct {
	SKU      string `json:"sku"`
	Stock    int64  `json:"stock"`
	Reserved int64  `json:"reserved"`
	Version  uint64 `json:"version"`
}

func getInv(t *testing.T, h http.Handler, sku string) inv {
	t.Helper()
	rec := call(h, http.MethodGet, "/v1/inventory/"+sku, "")
	var v inv
	if err := json.Unmarshal(rec.Body.Bytes(), &v); rec.Code != 200 || err != nil {
		t.Fatalf("GET inventory %s: %d %s", sku, rec.Code, rec.Body)
	}
	return v
}

func wantInv(t *testing.T, h http.Handler, sku string, stock, reserved int64) {
	t.Helper()
	if v := getInv(t, h, sku); v.Stock != stock || v.Reserved != reserved {
		t.Errorf("%s: stock %d reserved %d, want %d and %d", sku, v.Stock, v.Reserved, stock, reserved)
	}
}

func wantCode(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d body %s, want %d %s", rec.Code, rec.Body, status, code)
	}
	if code != "" {
		if got := errorCode(t, rec); got != code {
			t.Fatalf("code %q, want %q", got, code)
		}
	}
}

// TestReservationLifecycle: hold, read, confirm (twice), cancel refused;
// hold, cancel (twice), confirm refused; the stock moves between stock,
// reserved and orders at each step, under every guard.
func TestReservationLifecycle(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, guard := range storage.Guards {
		t.Run(string(guard), func(t *testing.T) {
			a, b := "life-a-"+string(guard), "life-b-"+string(guard)
			f.stock(a, 10)
			f.stock(b, 5)
			var locker order.Locker
			lock := "none"
			if guard != storage.GuardAtomic {
				locker, lock = local.New(), "local"
			}
			h := f.service(locker, order.Config{Lock: lock, Guard: guard}).Handler()

			rec := hold(h, 0, "", b, 2, a, 3)
			wantCode(t, rec, 201, "")
			r := decodeReservation(t, rec)
			if r.Status != "held" || len(r.Lines) != 2 || len(r.OrderIDs) != 0 || r.OrderIDs == nil ||
				time.Until(r.ExpiresAt) < 9*time.Minute || time.Until(r.ExpiresAt) > 11*time.Minute {
				t.Fatalf("held %+v: want status held, 2 lines, order_ids [], expires in the default 10m", r)
			}
			wantInv(t, h, a, 7, 3)
			wantInv(t, h, b, 3, 2)
			if got := decodeReservation(t, call(h, http.MethodGet, "/v1/reservations/"+r.ID, "")); got.ID != r.ID || got.Status != "held" {
				t.Fatalf("GET %+v", got)
			}

			c1 := decodeReservation(t, settle(h, r.ID, "confirm"))
			c2 := decodeReservation(t, settle(h, r.ID, "confirm"))
			if c1.Status != "confirmed" || len(c1.OrderIDs) != 2 || !slices.Equal(c1.OrderIDs, c2.OrderIDs) {
				t.Fatalf("confirm %+v then %+v: want confirmed with the same 2 orders", c1, c2)
			}
			for _, id := range c1.OrderIDs {
				o := decodeOrder(t, call(h, http.MethodGet, "/v1/orders/"+id, ""))
				if o.ReservationID != r.ID {
					t.Errorf("order %+v: reservation_id not %s", o, r.ID)
				}
			}
			wantCode(t, settle(h, r.ID, "cancel"), 409, "reservation_confirmed")
			wantInv(t, h, a, 7, 0)
			wantInv(t, h, b, 3, 0)
			if au := f.audit(a); au.Ordered != 3 || au.Orders != 1 {
				t.Errorf("%s: %+v, want one order of 3", a, au)
			}

			r2 := decodeReservation(t, hold(h, 60, "", a, 4))
			wantInv(t, h, a, 3, 4)
			x1 := decodeReservation(t, settle(h, r2.ID, "cancel"))
			x2 := decodeReservation(t, settle(h, r2.ID, "cancel"))
			if x1.Status != "cancelled" || x2.Status != "cancelled" {
				t.Fatalf("cancel twice: %s, %s", x1.Status, x2.Status)
			}
			wantCode(t, settle(h, r2.ID, "confirm"), 409, "reservation_cancelled")
			wantInv(t, h, a, 7, 0)
			if au := f.audit(a); au.Ordered != 3 {
				t.Errorf("%s: %+v: a cancel made orders", a, au)
			}
		})
	}
}

// TestReservationAllOrNothing: one line short refuses the whole hold and
// holds nothing, whatever the order of the lines.
func TestReservationAllOrNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("aon-a", 10)
	f.stock("aon-b", 1)
	h := f.service(local.New(), order.Config{Lock: "local"}).Handler()
	wantCode(t, hold(h, 0, "", "aon-a", 3, "aon-b", 2), 409, "out_of_stock")
	wantCode(t, hold(h, 0, "", "aon-b", 2, "aon-a", 3), 409, "out_of_stock")
	wantInv(t, h, "aon-a", 10, 0)
	wantInv(t, h, "aon-b", 1, 0)
	wantCode(t, hold(h, 0, "", "aon-a", 3, "aon-nope", 1), 404, "unknown_sku")
	wantInv(t, h, "aon-a", 10, 0)
	wantCode(t, hold(h, 0, "", "aon-a", 10, "aon-b", 1), 201, "")
	wantInv(t, h, "aon-a", 0, 10)
}

// TestReservationExpiry: past expires_at, by MySQL's clock, a confirm and
// a cancel are refused before any sweep, and the stock stays reserved
// until the sweeper gives it back, once.
func TestReservationExpiry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("exp-a", 5)
	// No Start: the sweeper runs only when the test calls Sweep.
	svc := f.service(local.New(), order.Config{Lock: "local"})
	h := svc.Handler()
	r := decodeReservation(t, hold(h, 1, "", "exp-a", 2))
	keep := decodeReservation(t, hold(h, 3600, "", "exp-a", 1))
	time.Sleep(1100 * time.Millisecond)
	wantCode(t, settle(h, r.ID, "confirm"), 409, "reservation_expired")
	wantCode(t, settle(h, r.ID, "cancel"), 409, "reservation_expired")
	wantInv(t, h, "exp-a", 2, 3) // not swept yet: still reserved
	if n, err := svc.Sweep(t.Context()); err != nil || n != 1 {
		t.Fatalf("sweep expired %d (%v), want 1", n, err)
	}
	if n, err := svc.Sweep(t.Context()); err != nil || n != 0 {
		t.Fatalf("second sweep expired %d (%v), want 0", n, err)
	}
	wantInv(t, h, "exp-a", 4, 1)
	if got := decodeReservation(t, call(h, http.MethodGet, "/v1/reservations/"+r.ID, "")); got.Status != "expired" {
		t.Errorf("status %q, want expired", got.Status)
	}
	wantCode(t, settle(h, r.ID, "confirm"), 409, "reservation_expired")
	if got := decodeReservation(t, settle(h, keep.ID, "confirm")); got.Status != "confirmed" {
		t.Errorf("the unexpired hold: %q, want confirmed", got.Status)
	}
}

// TestReservationBadInput: every malformed hold is a 400, a reused key 422,
// unknown ids 404; none of them changes the stock or holds anything.
func TestReservationBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("bad-a", 10)
	f.stock("bad-b", 10)
	h := f.service(local.New(), order.Config{Lock: "local"}).Handler()
	first := hold(h, 0, "k-1", "bad-a", 1)
	wantCode(t, first, 201, "")
	id := decodeReservation(t, first).ID

	for name, body := range map[string]string{
		"no lines":         `{}`,
		"empty lines":      `{"lines":[]}`,
		"null lines":       `{"lines":null}`,
		"lines not array":  `{"lines":{"sku":"bad-a","quantity":1}}`,
		"line not object":  `{"lines":["bad-a"]}`,
		"duplicate sku":    `{"lines":[{"sku":"bad-a","quantity":1},{"sku":"bad-a","quantity":1}]}`,
		"zero quantity":    `{"lines":[{"sku":"bad-a","quantity":0}]}`,
		"big quantity":     `{"lines":[{"sku":"bad-a","quantity":1001}]}`,
		"float quantity":   `{"lines":[{"sku":"bad-a","quantity":1.5}]}`,
		"string quantity":  `{"lines":[{"sku":"bad-a","quantity":"1"}]}`,
		"bad sku":          `{"lines":[{"sku":"bad a","quantity":1}]}`,
		"unknown line key": `{"lines":[{"sku":"bad-a","quantity":1,"x":1}]}`,
		"missing quantity": `{"lines":[{"sku":"bad-a"}]}`,
		"SKU case":         `{"lines":[{"SKU":"bad-a","quantity":1}]}`,
		"unknown field":    `{"lines":[{"sku":"bad-a","quantity":1}],"x":1}`,
		"ttl zero":         `{"lines":[{"sku":"bad-a","quantity":1}],"ttl_seconds":0}`,
		"ttl too long":     `{"lines":[{"sku":"bad-a","quantity":1}],"ttl_seconds":86401}`,
		"ttl null":         `{"lines":[{"sku":"bad-a","quantity":1}],"ttl_seconds":null}`,
		"trailing":         `{"lines":[{"sku":"bad-a","quantity":1}]} {}`,
		"21 lines":         lines21(),
		"not json":         `lines`,
	} {
		t.Run(name, func(t *testing.T) {
			wantCode(t, call(h, http.MethodPost, "/v1/reservations", body), 400, "invalid_request")
		})
	}
	wantCode(t, call(h, http.MethodPost, "/v1/reservations", `{"lines":[{"sku":"bad-a","quantity":1}]}`, "Content-Type", "text/plain"), 400, "invalid_request")
	wantCode(t, hold(h, 0, "k-1", "bad-a", 2), 422, "idempotency_key_reused")
	wantCode(t, hold(h, 0, "k-1", "bad-a", 1, "bad-b", 1), 422, "idempotency_key_reused")
	wantCode(t, hold(h, 0, "K-1", "bad-a", 1), 201, "") // another key: keys are exact
	replay := hold(h, 0, "k-1", "bad-a", 1)
	wantCode(t, replay, 200, "")
	if got := decodeReservation(t, replay).ID; got != id {
		t.Errorf("replay answered %s, want %s", got, id)
	}
	wantCode(t, call(h, http.MethodGet, "/v1/reservations/nope", ""), 404, "not_found")
	wantCode(t, settle(h, "0190a4a0-0000-7000-8000-000000000000", "confirm"), 404, "not_found")
	wantCode(t, settle(h, "0190A4A0-0000-7000-8000-000000000000", "cancel"), 404, "not_found")
	wantInv(t, h, "bad-a", 8, 2) // the two 201s
	wantInv(t, h, "bad-b", 10, 0)
}

// rawDB is a plain connection to the fixture's database.
func (f *fixture) rawDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func lines21() string {
	var ls []map[string]any
	for i := range 21 {
		ls = append(ls, map[string]any{"sku": fmt.Sprintf("bad-%d", i), "quantity": 1})
	}
	b, _ := json.Marshal(map[string]any{"lines": ls})
	return string(b)
}

// TestReservationStorm: three replicas sharing one MariaDB and a real
// distributed lock, workers released at once, each holding the same two
// SKUs in either order, then confirming, cancelling or abandoning the hold
// (it expires and the sweepers give it back). Nothing is over-reserved, no
// wait times out (the sorted lock order), and once the last hold has
// ended every reservation was settled exactly once: stock + reserved +
// sold is the stock set, reserved is 0, and orders exist only for
// confirmed reservations, one per line. Not parallel: its load would slow
// the other tests' lock waits.
func TestReservationStorm(t *testing.T) {
	names := []string{"redis", "mysql"}
	if !testing.Short() {
		names = append(names, "etcd", "zookeeper")
	}
	for _, name := range names {
		for _, guard := range []storage.Guard{storage.GuardVersion, storage.GuardFencing} {
			t.Run(name+"/"+string(guard), func(t *testing.T) {
				f := newFixture(t) // a database of its own: its own sweeper fence
				bc := map[string]func() backends.Config{
					"redis":     func() backends.Config { return backends.Config{RedisAddr: f.redis} },
					"mysql":     func() backends.Config { return backends.Config{MySQLDSN: f.dsn} },
					"etcd":      func() backends.Config { return backends.Config{EtcdEndpoints: testbed.Etcd(t)} },
					"zookeeper": func() backends.Config { return backends.Config{ZKServers: testbed.ZooKeeper(t)} },
				}[name]()
				storm(t, f, name, bc, guard)
			})
		}
	}
}

func storm(t *testing.T, f *fixture, backend string, bc backends.Config, guard storage.Guard) {
	const stock, workers, rounds = 40, 24, 4
	a, b := "storm-a-"+backend+"-"+string(guard), "storm-b-"+backend+"-"+string(guard)
	f.stock(a, stock)
	f.stock(b, stock)
	bc.TTL = 5 * time.Second
	var svcs []*order.Service
	var hs []http.Handler
	for i := range 3 {
		l, err := backends.Open(t.Context(), backend, bc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		svc := f.service(l, order.Config{Instance: fmt.Sprintf("%s-%d", t.Name(), i), Lock: backend, Guard: guard,
			// A deadlock would wait out LockWait and answer lock_timeout;
			// 20 s keeps a loaded machine's slow grants from looking like one.
			LockWait: 20 * time.Second, SweepInterval: 200 * time.Millisecond})
		svcs = append(svcs, svc)
		hs = append(hs, svc.Handler())
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	for w := range workers {
		wg.Go(func() {
			<-start
			for r := range rounds {
				h := hs[(w+r)%len(hs)]
				// An abandoned hold expires in 1s; the others have time to settle.
				action, ttl := rand.IntN(3), 30
				if action == 2 {
					ttl = 1
				}
				var rec *httptest.ResponseRecorder
				if (w+r)%2 == 0 {
					rec = hold(h, ttl, "", a, 1+rand.IntN(3), b, 1+rand.IntN(3))
				} else {
					rec = hold(h, ttl, "", b, 1+rand.IntN(3), a, 1+rand.IntN(3))
				}
				key := "hold"
				if rec.Code == 201 {
					var got order.Reservation
					json.Unmarshal(rec.Body.Bytes(), &got)
					switch action {
					case 0:
						rec, key = settle(hs[(w+r+1)%len(hs)], got.ID, "confirm"), "confirm"
					case 1:
						rec, key = settle(hs[(w+r+2)%len(hs)], got.ID, "cancel"), "cancel"
					default:
						key = "abandoned"
					}
				}
				if rec.Code >= 300 {
					key += " " + errorCode(t, rec)
				}
				key += fmt.Sprint(" ", rec.Code)
				mu.Lock()
				codes[key]++
				mu.Unlock()
			}
		})
	}
	// The sweepers run while the storm goes on.
	sctx, stopSweep := context.WithCancel(t.Context())
	var sweeps sync.WaitGroup
	for _, svc := range svcs {
		sweeps.Go(func() {
			for sctx.Err() == nil {
				svc.Sweep(sctx)
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	close(start)
	wg.Wait()
	time.Sleep(1100 * time.Millisecond) // every hold past its TTL
	deadline := time.Now().Add(10 * time.Second)
	for {
		var held int64
		f.rawDB(t).QueryRowContext(t.Context(), "SELECT COUNT(*) FROM reservations WHERE status = 'held' AND (`lines` LIKE ? OR `lines` LIKE ?)",
			"%\""+a+"\"%", "%\""+b+"\"%").Scan(&held)
		if held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d holds still held 10s after their expiry; outcomes %v", held, codes)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopSweep()
	sweeps.Wait()
	t.Logf("outcomes %v", codes)
	for k, n := range codes {
		if k != "abandoned 201" && k != "hold out_of_stock 409" && k != "confirm 200" && k != "cancel 200" {
			t.Errorf("%d x %s: want only 201 holds settled with 200, 409 out_of_stock and abandoned holds", n, k)
		}
	}
	if codes["confirm 200"] == 0 || codes["cancel 200"] == 0 || codes["abandoned 201"] == 0 || codes["hold out_of_stock 409"] == 0 {
		t.Errorf("outcomes %v: want confirms, cancels, abandoned holds and out_of_stock refusals", codes)
	}
	db := f.rawDB(t)
	for _, sku := range []string{a, b} {
		au := f.audit(sku)
		if au.Stock+au.Reserved+au.Ordered != stock || au.Reserved != 0 || au.Stock < 0 {
			t.Errorf("%s: %+v: want stock + reserved + sold = %d and reserved 0", sku, au, stock)
		}
	}
	// Orders only of confirmed reservations, exactly one per line.
	var bad int64
	err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM reservations r WHERE (r.`lines` LIKE ? OR r.`lines` LIKE ?) AND "+
		"(SELECT COUNT(*) FROM orders o WHERE o.reservation_id = r.id) <> IF(r.status = 'confirmed', 2, 0)",
		"%\""+a+"\"%", "%\""+b+"\"%").Scan(&bad)
	if err != nil || bad != 0 {
		t.Errorf("%d reservations whose orders are not one per line of a confirmed one (%v)", bad, err)
	}
}

// TestHoldWaitsForAFrozenWriter: a holder frozen between its UPDATE and its
// COMMIT (its lease gone, a GC pause or the lab's before-commit hook) must
// not be read around by the next holder: under guard none, a hold built on
// the row before that write would overwrite it (stock 9, reserved 1: the
// frozen -5 lost). Orders and holds read the latest commit alike.
func TestHoldWaitsForAFrozenWriter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.redisReplicas(1, order.Config{Guard: storage.GuardNone})[0]
	for _, kind := range []string{"order", "hold"} {
		sku := "frozen-" + kind
		f.stock(sku, 10)
		tx, err := f.rawDB(t).BeginTx(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec("UPDATE inventory SET stock = stock - 5, version = version + 1 WHERE sku = ?", sku); err != nil {
			t.Fatal(err)
		}
		done := make(chan *httptest.ResponseRecorder)
		go func() {
			if kind == "order" {
				done <- post(h, sku, 1)
			} else {
				done <- hold(h, 0, "", sku, 1)
			}
		}()
		time.Sleep(700 * time.Millisecond) // the request reads while the write is in flight
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		rec := <-done
		if rec.Code != http.StatusCreated {
			t.Errorf("%s: %d %s", kind, rec.Code, rec.Body)
		}
		if a := f.audit(sku); a.Stock+a.Reserved+a.Ordered != 5 {
			t.Errorf("%s: stock %d + reserved %d + ordered %d, want 5: the frozen writer's -5 was overwritten", kind, a.Stock, a.Reserved, a.Ordered)
		}
	}
}
