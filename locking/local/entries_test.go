package local

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Entries exist only while a key is held or awaited, so a service that
// locks millions of SKUs over its life does not keep a mutex for each.
func TestEntriesFreedWhenUnused(t *testing.T) {
	l := New()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("sku/%d", i%5)
			lease, err := l.Acquire(t.Context(), key)
			if err != nil {
				t.Error(err)
				return
			}
			if err := lease.Release(t.Context()); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()

	held, err := l.Acquire(t.Context(), "sku/held")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Acquire(ctx, "sku/held"); err == nil {
		t.Fatal("acquired a held key")
	}
	if n := l.held(); n != 1 {
		t.Fatalf("%d entries while one key is held, want 1 (a cancelled waiter must drop its reference)", n)
	}
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := l.held(); n != 0 {
		t.Fatalf("%d entries after every lease was released, want 0", n)
	}
}
