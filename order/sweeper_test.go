package order_test

import (
	"errors"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// TestSweepSkipsRefusedSKU: under the redis lock and guard fencing, the
// oldest due holds, more than a batch of them, are on a SKU whose fence is
// ahead of the backend's tokens (another backend's, or a Redis restarted
// without persistence), so their expiry is refused on every pass. The
// sweep goes on past them and expires the younger ones; only the sweeper
// fence refusing (a newer sweeper took over) stops a pass. A sweeper that
// stopped at any refusal expired at most the few it had launched
// alongside the refused one; one that read its batches from the oldest
// due hold each time read the refused ones again and again and never
// reached the others.
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
	const stuck, free = 101, 12 // more than a batch; more than a pass launches at once
	f.stock("swept-stuck", stuck)
	f.stock("swept-free", 50)
	stuckIDs := make([]string, stuck)
	for i := range stuckIDs {
		stuckIDs[i] = decodeReservation(t, hold(h, 1, "", "swept-stuck", 1)).ID
	}
	time.Sleep(5 * time.Millisecond) // due after them
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
		wantStatus(t, f, id, storage.StatusExpired)
	}
	for _, id := range stuckIDs {
		wantStatus(t, f, id, storage.StatusHeld) // due, not swept
	}
	wantInv(t, h, "swept-free", 50, 0)
	wantInv(t, h, "swept-stuck", 0, stuck)

	// A newer sweeper has written: this one's pass stops, expiring nothing.
	more := decodeReservation(t, hold(h, 1, "", "swept-free", 1))
	if _, err := db.ExecContext(t.Context(), "UPDATE fences SET fence = ? WHERE name = ?", uint64(1)<<40, storage.SweeperFence); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), "UPDATE inventory SET fence = 0 WHERE sku = ?", "swept-stuck"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	n, err = svc.Sweep(t.Context())
	if n != 0 || !errors.Is(err, order.ErrLockLost) || !errors.Is(err, storage.ErrStaleSweeper) {
		t.Fatalf("sweep behind a newer sweeper's fence: expired %d (%v), want 0 and %v", n, err, storage.ErrStaleSweeper)
	}
	wantStatus(t, f, more.ID, storage.StatusHeld)
}

// wantStatus checks reservation id's status in MySQL (the API shows a due
// hold as expired, swept or not).
func wantStatus(t *testing.T, f *fixture, id, status string) {
	t.Helper()
	r, err := f.store.Reservation(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != status {
		t.Errorf("reservation %s: status %q in MySQL, want %q", id, r.Status, status)
	}
}
