package order_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// TestReservationKilledWrite: the connection of a hold's, then a cancel's,
// transaction is KILLed from another session while its stock write waits
// for a row lock (held by a third session): MySQL rolls it back, and the
// service is told only that the connection broke, an outcome it must ask
// MySQL about. Each is answered 503 and left nothing: no reservation, then
// the reservation still held, the stock as it was. An implementation that
// answered success for a broken connection without asking would answer 201
// and 200 here.
func TestReservationKilledWrite(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := f.rawDB(t)
	f.stock("rk", 10)
	h := f.service(nil, order.Config{Guard: storage.GuardVersion}).Handler()

	// killed runs req while the SKU's row is locked, kills the connection
	// of its stock write, and returns its answer.
	killed := func(req func() *httptest.ResponseRecorder) *httptest.ResponseRecorder {
		t.Helper()
		blocker, err := db.BeginTx(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer blocker.Rollback()
		if _, err := blocker.ExecContext(t.Context(), "SELECT stock FROM inventory WHERE sku = ? FOR UPDATE", "rk"); err != nil {
			t.Fatal(err)
		}
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- req() }()
		var id int64
		for deadline := time.Now().Add(10 * time.Second); id == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no stock write waits for the row after 10s")
			}
			err := db.QueryRowContext(t.Context(), `SELECT COALESCE(MAX(ID), 0) FROM information_schema.PROCESSLIST
				WHERE DB = DATABASE() AND INFO LIKE 'UPDATE inventory%'`).Scan(&id)
			if err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.ExecContext(t.Context(), fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
			t.Fatal(err)
		}
		if err := blocker.Commit(); err != nil {
			t.Fatal(err)
		}
		return <-done
	}

	rec := killed(func() *httptest.ResponseRecorder { return hold(h, 60, "", "rk", 2) })
	wantCode(t, rec, http.StatusServiceUnavailable, "unavailable")
	var holds int
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM reservations").Scan(&holds); err != nil || holds != 0 {
		t.Errorf("%d reservations in MySQL (%v) after a hold rolled back, want 0", holds, err)
	}
	wantStock(t, f, "rk", 10, 0)

	r := decodeReservation(t, hold(h, 60, "", "rk", 2))
	rec = killed(func() *httptest.ResponseRecorder { return settle(h, r.ID, "cancel") })
	wantCode(t, rec, http.StatusServiceUnavailable, "unavailable")
	if got := decodeReservation(t, call(h, http.MethodGet, "/v1/reservations/"+r.ID, "")); got.Status != "held" {
		t.Errorf("after a cancel rolled back: %q, want held", got.Status)
	}
	wantStock(t, f, "rk", 8, 2)
	if got := decodeReservation(t, settle(h, r.ID, "cancel")); got.Status != "cancelled" {
		t.Errorf("the cancel again: %q, want cancelled", got.Status)
	}
	wantStock(t, f, "rk", 10, 0)
}

// wantStock checks the SKU's row in MySQL.
func wantStock(t *testing.T, f *fixture, sku string, stock, reserved int64) {
	t.Helper()
	if a := f.audit(sku); a.Stock != stock || a.Reserved != reserved {
		t.Errorf("%s in MySQL: stock %d reserved %d, want %d and %d", sku, a.Stock, a.Reserved, stock, reserved)
	}
}
