package inventory_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/inventory"
)

func newGate(t *testing.T) *inventory.Gate {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testbed.Redis(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	return inventory.NewGate(rdb, testbed.Prefix(t)+":", "db")
}

func counter(t *testing.T, g *inventory.Gate, sku string) inventory.Counter {
	t.Helper()
	c, ok, err := g.Counter(t.Context(), sku)
	if err != nil || !ok {
		t.Fatalf("counter %q: %v %v", sku, ok, err)
	}
	return c
}

// A take is settled once, whoever settles it; a done after a back-check
// gave the take back takes it again (the order did commit); a back-check
// that read an earlier take of a tag leaves a later one alone; SKUs are
// exact bytes.
func TestGateSettlesOnce(t *testing.T) {
	g := newGate(t)
	ctx := t.Context()
	lines := []inventory.Line{{SKU: "SKU-1", Quantity: 2}}
	if err := g.Take(ctx, "t", "e1", time.Now(), lines); !errors.Is(err, inventory.ErrUnseeded) {
		t.Fatalf("take on no counter: %v, want ErrUnseeded", err)
	}
	for _, sku := range []string{"SKU-1", "sku-1"} {
		if err := g.Seed(ctx, sku, 5); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Seed(ctx, "SKU-1", 99); err != nil { // NX: kept at 5
		t.Fatal(err)
	}
	if err := g.Take(ctx, "t", "e1", time.Now(), lines); err != nil {
		t.Fatal(err)
	}
	if err := g.Take(ctx, "t", "e1", time.Now(), lines); !errors.Is(err, inventory.ErrInFlight) {
		t.Fatalf("second take of a tag in flight: %v", err)
	}
	if c := counter(t, g, "sku-1"); c.Stock != 5 {
		t.Fatalf("sku-1 moved with SKU-1: %+v", c)
	}
	// The back-check gives it back; the flow's own give-back then gives nothing.
	if back, err := g.Settle(ctx, inventory.Pending{Tag: "t", Entry: "e1"}, false, lines); err != nil || !back {
		t.Fatalf("back-check: %v %v", back, err)
	}
	if back, err := g.GiveBack(ctx, "t", lines); err != nil || back {
		t.Fatalf("second give-back: %v %v, want nothing given", back, err)
	}
	if c := counter(t, g, "SKU-1"); c.Stock != 5 || c.Held != 0 {
		t.Fatalf("after the give-backs: %+v, want 5, 0", c)
	}
	// Its order committed after all: done takes it again.
	if pending, err := g.Done(ctx, "t", lines); err != nil || pending {
		t.Fatalf("late done: %v %v", pending, err)
	}
	if c := counter(t, g, "SKU-1"); c.Stock != 3 || c.Held != 0 {
		t.Fatalf("after the late done: %+v, want 3, 0", c)
	}
	// A later take of the same tag is not the one a back-check read.
	if err := g.Take(ctx, "t", "e2", time.Now(), lines); err != nil {
		t.Fatal(err)
	}
	if back, err := g.Settle(ctx, inventory.Pending{Tag: "t", Entry: "e1"}, false, lines); err != nil || back {
		t.Fatalf("stale back-check settled a later take: %v %v", back, err)
	}
	if err := g.Take(ctx, "u", "e", time.Now(), []inventory.Line{{SKU: "SKU-1", Quantity: 2}}); !errors.Is(err, inventory.ErrShort) {
		t.Fatalf("take of 2 from 1: %v, want ErrShort", err)
	}
	if c := counter(t, g, "SKU-1"); c.Stock != 1 || c.Held != 2 {
		t.Fatalf("end: %+v, want 1, 2", c)
	}
}
