package storage_test

import (
	"testing"

	"github.com/oversold-lab/oversold/storage"
)

// TestAdoptFences: fences left by one backend's tokens are reset when the
// fleet moves to another backend, and only then.
func TestAdoptFences(t *testing.T) {
	s := openStore(t)
	ctx := t.Context()
	if _, err := s.PutInventory(ctx, storage.Put{SKU: "af", Stock: 5, Token: 1 << 33}); err != nil {
		t.Fatal(err)
	}
	fence := func() uint64 {
		t.Helper()
		inv, err := s.Inventory(ctx, "af")
		if err != nil {
			t.Fatal(err)
		}
		return inv.Fence
	}
	for _, step := range []struct {
		lock      string
		reset     bool
		wantFence uint64
	}{
		{"zookeeper", false, 1 << 33}, // first record: adopted as it stands
		{"zookeeper", false, 1 << 33},
		{"redis", true, 0},
		{"redis", false, 0},
	} {
		reset, err := s.AdoptFences(ctx, step.lock)
		if err != nil {
			t.Fatal(err)
		}
		if reset != step.reset || fence() != step.wantFence {
			t.Errorf("AdoptFences(%q): reset %v, fence %d; want %v, %d", step.lock, reset, fence(), step.reset, step.wantFence)
		}
	}
}
