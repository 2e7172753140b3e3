package order_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// errorMessage decodes {"error":{"code","message"}} and returns the message.
func errorMessage(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	var body struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("status %d body %q: %v", rec.Code, rec.Body, err)
	}
	return body.Error.Message
}

// TestSettleAnswersItsCommit: a confirm (and a cancel) whose write lands
// after the request's deadline, MySQL being slow (here: another session
// holds the reservation's row, as a long transaction would), committed:
// the answer says so (200, with the confirm's orders), never a 503 that
// tells the client nothing was written. The reads after the write run on
// a context of their own, not on the request's, which has run out.
func TestSettleAnswersItsCommit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("slow-commit", 10)
	h := f.service(local.New(), order.Config{Lock: "local", LockWait: 500 * time.Millisecond, RequestTimeout: time.Second}).Handler()
	db := f.rawDB(t)
	for _, op := range []string{"confirm", "cancel"} {
		t.Run(op, func(t *testing.T) {
			r := decodeReservation(t, hold(h, 60, "", "slow-commit", 2))
			tx, err := db.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var id string
			if err := tx.QueryRow("SELECT id FROM reservations WHERE id = ? FOR UPDATE", r.ID).Scan(&id); err != nil {
				t.Fatal(err)
			}
			done := make(chan *httptest.ResponseRecorder)
			go func() { done <- settle(h, r.ID, op) }()
			time.Sleep(1500 * time.Millisecond) // past the request's deadline: its write waits for the row
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			rec := <-done
			var status string
			if err := db.QueryRowContext(t.Context(), "SELECT status FROM reservations WHERE id = ?", r.ID).Scan(&status); err != nil {
				t.Fatal(err)
			}
			if status != map[string]string{"confirm": "confirmed", "cancel": "cancelled"}[op] {
				t.Fatalf("the %s was not written (status %s): nothing to check", op, status)
			}
			if rec.Code != http.StatusOK {
				t.Fatalf("%s committed (status %s) but answered %d %s", op, status, rec.Code, rec.Body)
			}
			got := decodeReservation(t, rec)
			if got.Status != status || (op == "confirm") != (len(got.OrderIDs) == 1) {
				t.Errorf("%s answered %+v, want status %s and its orders", op, got, status)
			}
		})
	}
}

// TestExpiredHoldReadsExpired: past expires_at by MySQL's clock, before
// any sweep, a GET and a replay of the hold's Idempotency-Key show status
// expired, as a confirm and a cancel answer reservation_expired. A read
// only reports: the stock stays reserved until a sweep gives it back, and
// stock + reserved + sold is the stock set throughout.
func TestExpiredHoldReadsExpired(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("read-exp", 5)
	svc := f.service(local.New(), order.Config{Lock: "local"}) // no Start: no sweeper
	h := svc.Handler()
	r := decodeReservation(t, hold(h, 1, "k-read-exp", "read-exp", 2))
	time.Sleep(1100 * time.Millisecond)
	wantCode(t, settle(h, r.ID, "confirm"), 409, "reservation_expired")
	if got := decodeReservation(t, call(h, http.MethodGet, "/v1/reservations/"+r.ID, "")); got.Status != "expired" {
		t.Errorf("GET past expires_at: status %q, want expired", got.Status)
	}
	replay := hold(h, 1, "k-read-exp", "read-exp", 2)
	wantCode(t, replay, 200, "")
	if got := decodeReservation(t, replay); got.ID != r.ID || got.Status != "expired" {
		t.Errorf("replay past expires_at: %s status %q, want %s expired", got.ID, got.Status, r.ID)
	}
	wantInv(t, h, "read-exp", 3, 2) // reported, not given back: the sweeper does that
	if a := f.audit("read-exp"); a.Stock+a.Reserved+a.Ordered != 5 {
		t.Errorf("stock %d + reserved %d + sold %d, want 5", a.Stock, a.Reserved, a.Ordered)
	}
	if n, err := svc.Sweep(t.Context()); n != 1 || err != nil {
		t.Fatalf("sweep expired %d (%v), want 1", n, err)
	}
	wantInv(t, h, "read-exp", 5, 0)
	if got := decodeReservation(t, call(h, http.MethodGet, "/v1/reservations/"+r.ID, "")); got.Status != "expired" {
		t.Errorf("GET after the sweep: status %q, want expired", got.Status)
	}
}

// TestHoldOutOfStockNamesLines: a hold refused out_of_stock names the SKUs
// of the lines that ran out, and only those, without stock figures, under
// a lock and under the atomic guard alone.
func TestHoldOutOfStockNamesLines(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, guard := range []storage.Guard{storage.GuardVersion, storage.GuardAtomic} {
		t.Run(string(guard), func(t *testing.T) {
			a, b, c := "oos-a-"+string(guard), "oos-b-"+string(guard), "oos-c-"+string(guard)
			f.stock(a, 10)
			f.stock(b, 1)
			f.stock(c, 0)
			var locker order.Locker
			lock := "none"
			if guard != storage.GuardAtomic {
				locker, lock = local.New(), "local"
			}
			h := f.service(locker, order.Config{Lock: lock, Guard: guard}).Handler()
			rec := hold(h, 0, "", a, 3, b, 2, c, 1)
			wantCode(t, rec, 409, "out_of_stock")
			if msg, want := errorMessage(t, rec), "not enough stock for the quantity of skus "+b+", "+c; msg != want {
				t.Errorf("message %q, want %q", msg, want)
			}
			rec = hold(h, 0, "", a, 3, b, 2)
			wantCode(t, rec, 409, "out_of_stock")
			if msg, want := errorMessage(t, rec), "not enough stock for the quantity of sku "+b; msg != want {
				t.Errorf("message %q, want %q", msg, want)
			}
			wantInv(t, h, a, 10, 0)
		})
	}
}
