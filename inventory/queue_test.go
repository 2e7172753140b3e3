package inventory_test

import (
	"errors"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/inventory"
)

// An accepted order is taken from the counter and appended in one step;
// a short one appends nothing; a key accepted once returns its order;
// settling moves the counter once however often an entry is settled (a
// redelivery), and leaves the stream empty.
func TestQueueAcceptAndSettleOnce(t *testing.T) {
	g := newGate(t)
	q := g.Queue()
	ctx := t.Context()
	if err := q.Group(ctx); err != nil {
		t.Fatal(err)
	}
	if err := q.Group(ctx); err != nil { // a second replica's start
		t.Fatalf("group created twice: %v", err)
	}
	o := inventory.Queued{ID: "o1", SKU: "S", Quantity: 2, Key: "k"}
	if _, err := q.Accept(ctx, o); !errors.Is(err, inventory.ErrUnseeded) {
		t.Fatalf("accept on no counter: %v, want ErrUnseeded", err)
	}
	if err := g.Seed(ctx, "S", 3); err != nil {
		t.Fatal(err)
	}
	if prev, err := q.Accept(ctx, o); err != nil || prev != "" {
		t.Fatalf("accept: %q %v", prev, err)
	}
	if prev, err := q.Accept(ctx, inventory.Queued{ID: "o2", SKU: "S", Quantity: 1, Key: "k"}); err != nil || prev != "o1" {
		t.Fatalf("accept under a key taken: %q %v, want o1", prev, err)
	}
	if _, err := q.Accept(ctx, inventory.Queued{ID: "o3", SKU: "S", Quantity: 2}); !errors.Is(err, inventory.ErrShort) {
		t.Fatalf("accept past the counter: %v, want ErrShort", err)
	}
	if c := counter(t, g, "S"); c.Stock != 1 || c.Held != 2 {
		t.Fatalf("counter %+v, want stock 1 held 2", c)
	}
	if n, _ := q.Len(ctx); n != 1 {
		t.Fatalf("stream length %d, want 1", n)
	}
	ds, err := q.Read(ctx, "c1", 10, time.Second)
	if err != nil || len(ds) != 1 || ds[0].Order != o {
		t.Fatalf("read %+v %v, want o1", ds, err)
	}
	if got, ok, err := q.Lookup(ctx, "o1"); err != nil || !ok || got != o {
		t.Fatalf("lookup while queued: %+v %v %v", got, ok, err)
	}
	// Rejected, settled twice (a redelivery): given back once.
	for range 2 {
		if err := q.Settle(ctx, "S", []inventory.Settled{{Delivery: ds[0]}}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if c := counter(t, g, "S"); c.Stock != 3 || c.Held != 0 {
		t.Fatalf("counter %+v after two settles of one rejection, want stock 3 held 0", c)
	}
	if n, _ := q.Len(ctx); n != 0 {
		t.Fatalf("stream length %d after the settle, want 0", n)
	}
	if _, ok, _ := q.Lookup(ctx, "o1"); ok {
		t.Fatal("o1 still queued after its settle")
	}
	if prev, err := q.Accept(ctx, inventory.Queued{ID: "o4", SKU: "S", Quantity: 1, Key: "k"}); err != nil || prev != "o1" {
		t.Fatalf("accept under a settled order's key: %q %v, want o1 (the marker outlives the settle)", prev, err)
	}
}
