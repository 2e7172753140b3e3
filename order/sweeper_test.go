package order_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// TestSweepSkipsRefusedSKU: under the redis lock and guard fencing, the
// oldest due hold is on a SKU whose fence is ahead of the backend's tokens
// (another backend's, or a Redis restarted without persistence), so its
// expiry is refused on every pass. The sweep goes on and expires the
// others; only the sweeper fence refusing (a newer sweeper took over)
// stops a pass. A sweeper that stopped at any refusal expired at most the
// few it had launched alongside the refused one.
func TestSweepSkipsRefusedSKU(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	locker, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Close() })
	// No Start: the sweeper runs only when the test calls Sweep.
	svc := f.service(locker, order.Config{Lock: "redis", Guard: storage.GuardFencing, LockWait: 10 * time.Second})
	h := svc.Handler()
	f.stock("swept-stuck", 5)
	f.stock("swept-free", 50)
	const free = 12 // more than a pass launches at once
	stuck := decodeReservation(t, hold(h, 1, "", "swept-stuck", 1))
	time.Sleep(5 * time.Millisecond) // due first
	ids := make([]string, free)
	for i := range ids {
		ids[i] = decodeReservation(t, hold(h, 1, "", "swept-free", 1)).ID
	}
	db := f.rawDB(t)
	if _, err := db.ExecContext(t.Context(), "UPDATE inventory SET fence = ? WHERE sku = ?", uint64(1)<<40, "swept-stuck"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)

	n, err := svc.Sweep(t.Context())
	if err != nil || n != free {
		t.Fatalf("sweep expired %d (%v), want the %d holds of the SKU the sweeper may write", n, err, free)
	}
	for _, id := range ids {
		if got := decodeReservation(t, call(h, http.MethodGet, "/v1/reservations/"+id, "")); got.Status != "expired" {
			t.Errorf("reservation %s: %q, want expired", id, got.Status)
		}
	}
	if got := decodeReservation(t, call(h, http.MethodGet, "/v1/reservations/"+stuck.ID, "")); got.Status != "held" {
		t.Errorf("the refused SKU's reservation: %q, want held", got.Status)
	}
	wantInv(t, h, "swept-free", 50, 0)

	// A newer sweeper has written: this one's pass stops, expiring nothing.
	more := decodeReservation(t, hold(h, 1, "", "swept-free", 1))
	if _, err := db.ExecContext(t.Context(), "UPDATE fences SET fence = ? WHERE name = ?", uint64(1)<<40, storage.SweeperFence); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	n, err = svc.Sweep(t.Context())
	if n != 0 || !errors.Is(err, order.ErrLockLost) || !errors.Is(err, storage.ErrStaleSweeper) {
		t.Fatalf("sweep behind a newer sweeper's fence: expired %d (%v), want 0 and %v", n, err, storage.ErrStaleSweeper)
	}
	if got := decodeReservation(t, call(h, http.MethodGet, "/v1/reservations/"+more.ID, "")); got.Status != "held" {
		t.Errorf("a stale sweeper's pass: reservation %q, want held", got.Status)
	}
}
