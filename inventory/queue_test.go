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
	if _, err := q.Accept(ctx, o, false); !errors.Is(err, inventory.ErrUnseeded) {
		t.Fatalf("accept on no counter: %v, want ErrUnseeded", err)
	}
	if err := g.Seed(ctx, "S", 3); err != nil {
		t.Fatal(err)
	}
	if prev, err := q.Accept(ctx, o, true); err != nil || prev != "" {
		t.Fatalf("accept: %q %v", prev, err)
	}
	if prev, err := q.Accept(ctx, inventory.Queued{ID: "o2", SKU: "S", Quantity: 1, Key: "k"}, false); err != nil || prev != "o1" {
		t.Fatalf("accept under a key taken: %q %v, want o1", prev, err)
	}
	if _, err := q.Accept(ctx, inventory.Queued{ID: "o3", SKU: "S", Quantity: 2}, false); !errors.Is(err, inventory.ErrShort) {
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
	if prev, err := q.Accept(ctx, inventory.Queued{ID: "o4", SKU: "S", Quantity: 1, Key: "k"}, false); err != nil || prev != "o1" {
		t.Fatalf("accept under a settled order's key: %q %v, want o1 (the marker outlives the settle)", prev, err)
	}
}

// A stream and group gone (a Redis restarted without persistence) are made
// again by the next read or claim, which then finds what is accepted since.
func TestQueueRegroups(t *testing.T) {
	g, rdb, prefix := gateOn(t)
	q := g.Queue()
	ctx := t.Context()
	if err := g.Seed(ctx, "S", 3); err != nil {
		t.Fatal(err)
	}
	for _, read := range []func() ([]inventory.Delivery, error){
		func() ([]inventory.Delivery, error) { return q.Claim(ctx, "c1", time.Millisecond, 10) },
		func() ([]inventory.Delivery, error) { return q.Read(ctx, "c1", 10, 10*time.Millisecond) },
	} {
		if err := rdb.Del(ctx, prefix+"{db:gate}:queue").Err(); err != nil { // the restart
			t.Fatal(err)
		}
		if _, err := read(); err != nil {
			t.Fatalf("read after the stream went: %v", err)
		}
	}
	if _, err := q.Accept(ctx, inventory.Queued{ID: "o1", SKU: "S", Quantity: 1}, false); err != nil {
		t.Fatal(err)
	}
	if ds, err := q.Read(ctx, "c1", 10, time.Second); err != nil || len(ds) != 1 {
		t.Fatalf("read after the group was made again: %+v %v, want o1", ds, err)
	}
}

// A Redis restarted without persistence loses the counter, the queued
// hash and the stream while a consumer holds a batch it read. The counter
// seeded again from MySQL does not count that batch, which commits after:
// its confirmed orders are taken from the new counter when they settle
// (their entries carry the old counter's epoch), once however often they
// are settled, or the gate would admit that many orders more than MySQL
// holds, to be rejected after their 202. A rejected one gives nothing
// back; an entry of an older version (no epoch) takes nothing. Without a
// loss, an entry settled twice (two consumers after a claim) counts once,
// across a PUT too (a reset keeps the epoch).
func TestQueueSettleAfterDataLoss(t *testing.T) {
	g, rdb, prefix := gateOn(t)
	q := g.Queue()
	ctx := t.Context()
	if err := q.Group(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Seed(ctx, "S", 10); err != nil {
		t.Fatal(err)
	}
	accept := func(id string, n int64) inventory.Delivery {
		t.Helper()
		if _, err := q.Accept(ctx, inventory.Queued{ID: id, SKU: "S", Quantity: n}, true); err != nil {
			t.Fatal(err)
		}
		ds, err := q.Read(ctx, "c1", 10, time.Second)
		if err != nil || len(ds) != 1 || ds[0].Order.ID != id {
			t.Fatalf("read %+v %v, want %s", ds, err, id)
		}
		return ds[0]
	}
	settle := func(d inventory.Delivery, confirmed bool) {
		t.Helper()
		if err := q.Settle(ctx, "S", []inventory.Settled{{Delivery: d, Confirmed: confirmed}}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	want := func(stock int64, when string) {
		t.Helper()
		if c := counter(t, g, "S"); c.Stock != stock || c.Held != 0 {
			t.Fatalf("counter %+v %s, want stock %d, held 0", c, when, stock)
		}
	}
	d1 := accept("o1", 1)
	settle(d1, true)
	settle(d1, true)
	want(9, "after two settles of one confirmed order")
	if err := g.Reset(ctx, "S", 9); err != nil { // a PUT: MySQL's stock again
		t.Fatal(err)
	}
	settle(d1, true)
	want(9, "after a PUT and a third settle of that order")

	d2, d3, d4 := accept("o2", 2), accept("o3", 3), accept("o4", 1) // stock 3, held 6
	// o4 as an older version appends it: without an epoch.
	d4.Epoch = ""
	// The loss: every key of the gate and the queue goes.
	loseData(t, rdb, prefix)
	// Seeded again from MySQL, which holds o1 only: 9. Then o2 and o4
	// commit, o3 is rejected.
	if err := g.Seed(ctx, "S", 9); err != nil {
		t.Fatal(err)
	}
	if err := q.Group(ctx); err != nil {
		t.Fatal(err)
	}
	settle(d2, true)
	settle(d2, true) // a second consumer, or the settle sent again
	settle(d3, false)
	settle(d4, true)
	want(7, "after the lost batch settled (o2 committed and settled twice, o3 rejected, o4 of an older version)")
}
