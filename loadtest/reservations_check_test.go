package loadtest

import (
	"database/sql"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/storage"
)

// TestCheckReservationsSeesDoubleGiveBack: the checker must see a
// reservation given back twice even where the sum stock + reserved + sold
// still equals the stock set and nothing is left reserved. The state is
// made by orderd's own storage, then broken the way a settle without its
// conditional status change would break it (or a guard-none write from a
// stale read, which the ledger does not explain).
func TestCheckReservationsSeesDoubleGiveBack(t *testing.T) {
	dsn := testbed.MySQL(t)
	st, err := storage.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := t.Context()
	const sku = "hot-1"
	if _, err := st.PutInventory(ctx, storage.Put{SKU: sku, Stock: 10}); err != nil {
		t.Fatal(err)
	}
	// hold holds one of sku for an hour.
	hold := func() string {
		t.Helper()
		inv, err := st.Inventory(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		r := storage.Reservation{ID: uuid.NewString(), Instance: "r1", Lock: "redis", Lines: storage.Lines{{SKU: sku, Quantity: 1}}}
		r, _, err = st.Hold(ctx, storage.GuardVersion, r, time.Hour, []storage.Move{{Seen: inv, Stock: -1, Reserved: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return r.ID
	}
	cancel := func(id string) {
		t.Helper()
		inv, err := st.Inventory(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = st.Settle(ctx, storage.GuardVersion, storage.Settlement{ID: id, To: storage.StatusCancelled, By: "r1"},
			[]storage.Move{{Seen: inv, Stock: 1, Reserved: -1}})
		if err != nil {
			t.Fatal(err)
		}
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	check := func() ReservationInvariants {
		t.Helper()
		inv, err := CheckReservations(ctx, db, []string{sku}, 10, nil, nil, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return inv
	}

	first, second := hold(), hold()
	cancel(first)
	if inv := check(); inv.DoubleSettled != 0 || inv.LedgerMismatch != 0 || inv.LostUpdates != 0 {
		t.Fatalf("a cancelled and a held reservation: %+v; want nothing wrong", inv)
	}

	// The first reservation given back again, by a settle that skipped the
	// status change: its stock write and its ledger line.
	exec("UPDATE inventory SET stock = stock + 1, reserved = reserved - 1 WHERE sku = ?", sku)
	exec("INSERT INTO reservation_moves (reservation_id, sku, op, stock, reserved, instance, token, created_at) VALUES (?, ?, 'cancel', 1, -1, 'r2', 0, NOW(6))", first, sku)
	inv := check()
	if inv.LostUpdates != 0 || inv.Oversold != 0 || inv.ReservedLeft != 0 {
		t.Fatalf("the sums changed: %+v (the case is meant to keep them)", inv)
	}
	if inv.DoubleSettled != 1 {
		t.Errorf("double settled %d, want 1: the ledger shows %s given back twice", inv.DoubleSettled, first)
	}
	_ = second // still held, its unit given to the first's second give-back

	// A write the ledger does not explain: guard none writing back a row
	// it read before another transition.
	exec("UPDATE inventory SET stock = stock + 1 WHERE sku = ?", sku)
	if inv := check(); inv.LedgerMismatch != 1 {
		t.Errorf("ledger mismatch %d, want 1 for a unit no transition moved", inv.LedgerMismatch)
	}
}
