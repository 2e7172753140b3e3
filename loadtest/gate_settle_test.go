package loadtest

import (
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/inventory"
)

// The lab watches a pre-deduction that never committed until the gate
// gives it back: withheld while pending, 0 once given back.
func TestSettleGate(t *testing.T) {
	db := crafted{stock: map[string]int{"settle": 10}}.database(t)
	addr := testbed.Redis(t)
	rdb, err := redisconn.Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	var identity string
	if err := db.QueryRowContext(t.Context(), "SELECT value FROM meta WHERE name = 'database_identity'").Scan(&identity); err != nil {
		t.Fatal(err)
	}
	gate := inventory.NewGate(rdb, "oversold:", identity)
	ctx := t.Context()
	lines := []inventory.Line{{SKU: "settle", Quantity: 3}}
	if err := gate.Seed(ctx, "settle", 10); err != nil {
		t.Fatal(err)
	}
	if err := gate.Take(ctx, "dead-replica", "{}", time.Now(), inventory.TakeKey{}, lines); err != nil {
		t.Fatal(err)
	}
	rn := &Runner{DB: db}
	if n, err := withheldBy(ctx, rn, gate, []string{"settle"}); err != nil || n != 3 {
		t.Fatalf("withheld %d (%v) with a take of 3 pending, want 3", n, err)
	}
	go func() {
		time.Sleep(time.Second)
		if _, err := gate.GiveBack(ctx, "dead-replica", lines); err != nil {
			t.Error(err)
		}
	}()
	res := &Result{Undersold: 3}
	if err := rn.settleGate(ctx, &Run{Servers: Servers{RedisAddr: addr}}, nil, []string{"settle"}, res); err != nil {
		t.Fatal(err)
	}
	if res.UndersoldSettled == nil || *res.UndersoldSettled != 0 || res.SettledMS == nil {
		t.Fatalf("settled %v after %v, want 0 once given back", res.UndersoldSettled, res.SettledMS)
	}
	if got := undersoldCell(res.Undersold, res.UndersoldSettled); got != "3 → 0" {
		t.Errorf("cell %q, want 3 → 0", got)
	}
}
