package inventory_test

import (
	"context"
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
	if err := g.Take(ctx, "t", "e1", time.Now(), inventory.TakeKey{}, lines); !errors.Is(err, inventory.ErrUnseeded) {
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
	if err := g.Take(ctx, "t", "e1", time.Now(), inventory.TakeKey{}, lines); err != nil {
		t.Fatal(err)
	}
	if err := g.Take(ctx, "t", "e1", time.Now(), inventory.TakeKey{}, lines); !errors.Is(err, inventory.ErrInFlight) {
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
	if err := g.Take(ctx, "t", "e2", time.Now(), inventory.TakeKey{}, lines); err != nil {
		t.Fatal(err)
	}
	if back, err := g.Settle(ctx, inventory.Pending{Tag: "t", Entry: "e1"}, false, lines); err != nil || back {
		t.Fatalf("stale back-check settled a later take: %v %v", back, err)
	}
	if err := g.Take(ctx, "u", "e", time.Now(), inventory.TakeKey{}, []inventory.Line{{SKU: "SKU-1", Quantity: 2}}); !errors.Is(err, inventory.ErrShort) {
		t.Fatalf("take of 2 from 1: %v, want ErrShort", err)
	}
	if c := counter(t, g, "SKU-1"); c.Stock != 1 || c.Held != 2 {
		t.Fatalf("end: %+v, want 1, 2", c)
	}
}

// The take script's answers under a key: taken (the key remembered),
// known (the gate took for it before), check (short, and the key set not
// known complete), short (the set complete, or the key checked in MySQL);
// a hold's key naming a queued order is refused. The set is complete only
// once loaded, and not any more once its Redis lost its data.
func TestGateKeys(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: testbed.Redis(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	prefix := testbed.Prefix(t) + ":"
	g := inventory.NewGate(rdb, prefix, "db")
	ctx := t.Context()
	lines := []inventory.Line{{SKU: "S", Quantity: 1}}
	take := func(tag string, key inventory.TakeKey) error {
		return g.Take(ctx, tag, "e", time.Now().Add(time.Hour), key, lines)
	}
	if err := g.Seed(ctx, "S", 1); err != nil {
		t.Fatal(err)
	}
	if err := take("order:key:a", inventory.TakeKey{Key: "a"}); err != nil {
		t.Fatalf("take under a: %v", err)
	}
	for _, tc := range []struct {
		name string
		key  inventory.TakeKey
		want error
	}{
		{"known, in stock or not", inventory.TakeKey{Key: "a"}, inventory.ErrKnown},
		{"known, checked: in flight", inventory.TakeKey{Key: "a", Checked: true}, inventory.ErrInFlight},
		{"new key, set incomplete", inventory.TakeKey{Key: "b"}, inventory.ErrCheck},
		{"new key, checked", inventory.TakeKey{Key: "b", Checked: true}, inventory.ErrShort},
		{"no key", inventory.TakeKey{}, inventory.ErrShort},
	} {
		if err := take("order:key:"+tc.key.Key, tc.key); !errors.Is(err, tc.want) {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}

	// MySQL holds m (taken for before the gate's Redis lost its data).
	var loads int
	load := func(context.Context) ([]string, bool, error) { loads++; return []string{"m"}, true, nil }
	if ok, err := g.CompleteKeys(ctx, load); err != nil || !ok {
		t.Fatalf("complete keys: %v %v", ok, err)
	}
	if ok, err := g.CompleteKeys(ctx, load); err != nil || !ok || loads != 1 {
		t.Fatalf("complete keys again: %v %v, %d loads, want 1", ok, err, loads)
	}
	for _, tc := range []struct {
		key  string
		want error
	}{{"a", inventory.ErrKnown}, {"m", inventory.ErrKnown}, {"b", inventory.ErrShort}} {
		if err := take("order:key:"+tc.key, inventory.TakeKey{Key: tc.key}); !errors.Is(err, tc.want) {
			t.Fatalf("complete set, key %s: %v, want %v", tc.key, err, tc.want)
		}
	}
	// Too many keys to hold: the set stays incomplete.
	g2 := inventory.NewGate(rdb, prefix, "db2")
	if err := g2.Seed(ctx, "S", 0); err != nil {
		t.Fatal(err)
	}
	if ok, err := g2.CompleteKeys(ctx, func(context.Context) ([]string, bool, error) { return nil, false, nil }); err != nil || ok {
		t.Fatalf("complete keys with too many: %v %v, want false", ok, err)
	}
	if err := g2.Take(ctx, "t", "e", time.Now(), inventory.TakeKey{Key: "x"}, lines); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("incomplete set: %v, want ErrCheck", err)
	}
	// The queue looks a new key up first while the set is incomplete, in
	// stock or not: nothing after its accept would.
	if err := g2.Reset(ctx, "S", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := g2.Queue().Accept(ctx, inventory.Queued{ID: "o0", SKU: "S", Quantity: 1, Key: "x"}, false); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("accept under a new key, incomplete set: %v, want ErrCheck", err)
	}

	// A hold's key naming a queued order.
	q := g.Queue()
	if err := g.Reset(ctx, "S", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Accept(ctx, inventory.Queued{ID: "o1", SKU: "S", Quantity: 1, Key: "q"}, false); err != nil {
		t.Fatal(err)
	}
	if err := take("hold:key:q", inventory.TakeKey{Key: "q", Hold: true, Checked: true}); !errors.Is(err, inventory.ErrKeyQueued) {
		t.Fatalf("hold under a queued order's key: %v, want ErrKeyQueued", err)
	}
	if _, err := q.Accept(ctx, inventory.Queued{ID: "o2", SKU: "S", Quantity: 1, Key: "a"}, false); !errors.Is(err, inventory.ErrKnown) {
		t.Fatalf("accept under a key the gate took for: %v, want ErrKnown", err)
	}

	// The gate's Redis loses its data: a reseeded gate has no complete set
	// until it is loaded again, and a load whose MySQL read raced the loss
	// adds nothing (the key taken for before the loss may be missing).
	flush := func() {
		t.Helper()
		keys, err := rdb.Keys(ctx, prefix+"*").Result()
		if err != nil || len(keys) == 0 {
			t.Fatalf("gate keys: %v %v", keys, err)
		}
		if err := rdb.Del(ctx, keys...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	if err := g.Seed(ctx, "S", 0); err != nil {
		t.Fatal(err)
	}
	if err := take("order:key:b", inventory.TakeKey{Key: "b"}); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("reseeded gate, key b: %v, want ErrCheck", err)
	}
	ok, err := g.CompleteKeys(ctx, func(context.Context) ([]string, bool, error) {
		flush() // lost again while MySQL was read
		if err := g.Seed(ctx, "S", 0); err != nil {
			t.Fatal(err)
		}
		return []string{"a", "m"}, true, nil
	})
	if err != nil || ok {
		t.Fatalf("complete keys across a loss: %v %v, want false", ok, err)
	}
	if err := take("order:key:b", inventory.TakeKey{Key: "b"}); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("after a load that raced a loss, key b: %v, want ErrCheck", err)
	}
	if ok, err := g.CompleteKeys(ctx, load); err != nil || !ok {
		t.Fatalf("complete keys after the loss: %v %v", ok, err)
	}
	if err := take("order:key:m", inventory.TakeKey{Key: "m"}); !errors.Is(err, inventory.ErrKnown) {
		t.Fatalf("reloaded set, key m: %v, want ErrKnown", err)
	}
	if err := take("order:key:b", inventory.TakeKey{Key: "b"}); !errors.Is(err, inventory.ErrShort) {
		t.Fatalf("reloaded set, key b: %v, want ErrShort", err)
	}

	// The set was completed on this Redis process: the check keeps it.
	// Completed on another (a restart from persistence, a promoted
	// replica, which may have lost the latest keys): it is dropped.
	if dropped, err := g.CheckKeys(ctx); err != nil || dropped {
		t.Fatalf("check on the same process: %v %v, want kept", dropped, err)
	}
	if err := rdb.Set(ctx, prefix+"{db:gate}:keys:origin", "another-process", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if dropped, err := g.CheckKeys(ctx); err != nil || !dropped {
		t.Fatalf("check after a change of process: %v %v, want dropped", dropped, err)
	}
	if err := take("order:key:b", inventory.TakeKey{Key: "b"}); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("dropped set, key b: %v, want ErrCheck", err)
	}
}
