package inventory_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/inventory"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func newCache(t *testing.T) *inventory.Cache {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testbed.Redis(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	return inventory.New(rdb, testbed.Prefix(t)+":", "db")
}

// loader counts its calls and answers item.
func loader(item inventory.Item, calls *atomic.Int32) func(context.Context) (inventory.Item, error) {
	return func(context.Context) (inventory.Item, error) {
		calls.Add(1)
		return item, nil
	}
}

func TestFillOnMiss(t *testing.T) {
	t.Parallel()
	c := newCache(t)
	ctx := t.Context()
	var calls atomic.Int32
	want := inventory.Item{SKU: "a", Stock: 20, Version: 3}
	for range 3 {
		got, err := c.Get(ctx, "a", loader(want, &calls))
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("Get = %+v, want %+v", got, want)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("loaded %d times, want once: the first Get fills the cache", n)
	}

	// A loader's error (unknown SKU) comes back as is, and nothing is cached.
	unknown := errors.New("unknown sku")
	_, err := c.Get(ctx, "b", func(context.Context) (inventory.Item, error) { return inventory.Item{}, unknown })
	if !errors.Is(err, unknown) {
		t.Errorf("Get of a failing load = %v, want %v", err, unknown)
	}
	if _, err := c.Get(ctx, "b", loader(inventory.Item{SKU: "b", Stock: 1, Version: 1}, &calls)); err != nil || calls.Load() != 2 {
		t.Errorf("Get after a failed load = %v after %d loads, want a second load", err, calls.Load())
	}
}

// TestSetIfNewer: whatever order writers finish in, the cache ends at the
// newest version and never goes back.
func TestSetIfNewer(t *testing.T) {
	t.Parallel()
	c := newCache(t)
	ctx := t.Context()
	var calls atomic.Int32
	get := func() inventory.Item {
		t.Helper()
		got, err := c.Get(ctx, "s", loader(inventory.Item{SKU: "s", Stock: -1, Version: 0}, &calls))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	steps := []struct {
		set  inventory.Item
		want inventory.Item
	}{
		{inventory.Item{SKU: "s", Stock: 10, Version: 5}, inventory.Item{SKU: "s", Stock: 10, Version: 5}},
		{inventory.Item{SKU: "s", Stock: 9, Version: 6}, inventory.Item{SKU: "s", Stock: 9, Version: 6}},
		{inventory.Item{SKU: "s", Stock: 10, Version: 5}, inventory.Item{SKU: "s", Stock: 9, Version: 6}}, // late writer
		{inventory.Item{SKU: "s", Stock: 42, Version: 6}, inventory.Item{SKU: "s", Stock: 9, Version: 6}}, // same version: kept
		{inventory.Item{SKU: "s", Stock: 0, Version: 1 << 40}, inventory.Item{SKU: "s", Stock: 0, Version: 1 << 40}},
	}
	for i, st := range steps {
		if err := c.Set(ctx, st.set); err != nil {
			t.Fatal(err)
		}
		if got := get(); got != st.want {
			t.Errorf("step %d: after Set(%+v) the cache holds %+v, want %+v", i, st.set, got, st.want)
		}
	}

	// Many writers at once, in every order: the newest wins.
	const writers = 50
	start := make(chan struct{})
	var wg sync.WaitGroup
	for v := range writers {
		wg.Go(func() {
			<-start
			if err := c.Set(ctx, inventory.Item{SKU: "race", Stock: int64(1000 - v), Version: uint64(v + 1)}); err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	got, err := c.Get(ctx, "race", loader(inventory.Item{}, &calls))
	if want := (inventory.Item{SKU: "race", Stock: 1000 - writers + 1, Version: writers}); err != nil || got != want {
		t.Errorf("after %d racing writers: %+v, %v; want %+v", writers, got, err, want)
	}
	if calls.Load() != 0 {
		t.Errorf("loaded %d times, want 0: every Get was a hit", calls.Load())
	}
}

// TestSetVersionZero: an item without a version (a writer that could not
// learn its new one) is never cached, over an entry or in place of none.
func TestSetVersionZero(t *testing.T) {
	t.Parallel()
	c := newCache(t)
	ctx := t.Context()
	var calls atomic.Int32
	if err := c.Set(ctx, inventory.Item{SKU: "z", Stock: 5, Version: 0}); err != nil {
		t.Fatal(err)
	}
	want := inventory.Item{SKU: "z", Stock: 9, Version: 2}
	if got, err := c.Get(ctx, "z", loader(want, &calls)); err != nil || got != want || calls.Load() != 1 {
		t.Fatalf("Get = %+v, %v after %d loads; want %+v from one load: version 0 must not fill the cache", got, err, calls.Load(), want)
	}
	if err := c.Set(ctx, inventory.Item{SKU: "z", Stock: 5, Version: 0}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "z", loader(want, &calls)); err != nil || got != want {
		t.Errorf("Get = %+v, %v; want %+v kept", got, err, want)
	}
}

// TestSettleAndForce: Settle deletes an entry newer than MySQL's latest
// (the next read goes to MySQL); Force replaces any entry.
func TestSettleAndForce(t *testing.T) {
	t.Parallel()
	c := newCache(t)
	ctx := t.Context()
	var calls atomic.Int32
	truth := inventory.Item{SKU: "w", Stock: 4, Version: 7}
	wedged := inventory.Item{SKU: "w", Stock: 999, Version: 1000}
	if err := c.Force(ctx, wedged); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, truth); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Get(ctx, "w", loader(truth, &calls)); got != wedged {
		t.Fatalf("after Set of an older version: %+v, want the newer entry kept", got)
	}
	if err := c.Settle(ctx, truth); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "w", loader(truth, &calls)); err != nil || got != truth || calls.Load() != 1 {
		t.Errorf("after Settle: %+v, %v after %d loads; want MySQL's %+v loaded once", got, err, calls.Load(), truth)
	}
	if err := c.Force(ctx, inventory.Item{SKU: "w", Stock: 1, Version: 2}); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Get(ctx, "w", loader(truth, &calls)); got.Version != 2 {
		t.Errorf("after Force of version 2: %+v", got)
	}
}

// TestDeadRedis: against an address nobody listens on, calls fail with
// ErrDown, and Get does not call load: the caller decides what to do.
func TestDeadRedis(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	c := inventory.New(rdb, "dead:", "db")
	var calls atomic.Int32
	for range 3 {
		if _, err := c.Get(t.Context(), "x", loader(inventory.Item{SKU: "x", Stock: 1, Version: 1}, &calls)); !errors.Is(err, inventory.ErrDown) {
			t.Errorf("Get = %v, want ErrDown", err)
		}
		if err := c.Set(t.Context(), inventory.Item{SKU: "x", Stock: 1, Version: 1}); !errors.Is(err, inventory.ErrDown) {
			t.Errorf("Set = %v, want ErrDown", err)
		}
	}
	if calls.Load() != 0 {
		t.Errorf("load called %d times", calls.Load())
	}
}
