package loadtest

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestOverlaps(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	lease := func(inst, key string, tok uint64, from, to int, lost bool) LeaseRecord {
		l := LeaseRecord{Instance: inst, Key: key, Token: tok, AcquiredAt: at(from), Lost: lost}
		if lost {
			l.LostAt = at(to)
		} else {
			l.ReleasedAt = at(to)
		}
		return l
	}
	tests := []struct {
		name   string
		leases []LeaseRecord
		want   int
	}{
		{"hand-over", []LeaseRecord{lease("r1", "k", 1, 0, 10, false), lease("r2", "k", 2, 10, 20, false)}, 0},
		{"paused holder", []LeaseRecord{lease("r1", "k", 1, 0, 3000, true), lease("r2", "k", 2, 1100, 1110, false), lease("r3", "k", 3, 1110, 1120, false)}, 2},
		{"other key", []LeaseRecord{lease("r1", "a", 1, 0, 100, false), lease("r2", "b", 1, 50, 60, false)}, 0},
		{"same replica", []LeaseRecord{lease("r1", "k", 1, 0, 100, false), lease("r1", "k", 2, 50, 60, false)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Overlaps(tt.leases); len(got) != tt.want {
				t.Errorf("%d overlaps, want %d: %v", len(got), tt.want, got)
			}
		})
	}
}

// TestBatchesOf: only committed writes count (a refused batch sold
// nothing), each write's orders are summed, and a batch is a write of more
// than one order.
func TestBatchesOf(t *testing.T) {
	writes := []WriteRecord{
		{Orders: 1, Outcome: "committed"},
		{Orders: 4, Outcome: "refused"},
		{Orders: 3, Outcome: "committed"},
		{Orders: 9, Outcome: "refused"},
		{Orders: 2, Outcome: "committed"},
	}
	got := BatchesOf(writes)
	want := Batches{Writes: 3, Orders: 6, Multi: 2, Largest: 3}
	if got == nil || *got != want {
		t.Errorf("BatchesOf = %+v, want %+v", got, want)
	}
	if got := BatchesOf(writes[1:2]); got != nil {
		t.Errorf("only refused writes: %+v, want nil", got)
	}
}

func TestReadRecords(t *testing.T) {
	dir := t.TempDir()
	log := `not json
{"time":"2025-01-01T00:00:00Z","level":"INFO","msg":"orderd listening","instance":"r1"}
{"time":"2025-01-01T00:00:01Z","level":"INFO","msg":"lease","instance":"r1","key":"sku/a","token":7,"acquired_at":"2025-01-01T00:00:00.5Z","lost":false,"released_at":"2025-01-01T00:00:00.9Z"}
{"time":"2025-01-01T00:00:02Z","level":"INFO","msg":"lease","instance":"r1","key":"sku/a","token":8,"acquired_at":"2025-01-01T00:00:01Z","lost":true,"lost_at":"2025-01-01T00:00:03Z"}
{"time":"2025-01-01T00:00:02.5Z","level":"INFO","msg":"write","instance":"r1","sku":"a","token":8,"orders":2,"outcome":"refused"}
`
	if err := os.WriteFile(filepath.Join(dir, "r1.log"), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got, writes, err := ReadRecords(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Token != 7 || got[1].End().Second() != 3 || !got[1].Lost || got[0].Instance != "r1" {
		t.Errorf("leases %+v", got)
	}
	if len(writes) != 1 || writes[0].Token != 8 || writes[0].Outcome != "refused" || writes[0].Orders != 2 ||
		writes[0].Instance != "r1" || writes[0].At.UnixMilli()%1000 != 500 {
		t.Errorf("writes %+v", writes)
	}
}
