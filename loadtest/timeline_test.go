package loadtest

import (
	"testing"
	"time"
)

// TestTimelineDrawsOverlapOutsideWindow: two holders that overlapped on the
// drawn key before the fault struck are in the timeline, so the run's
// overlap count and its picture agree.
func TestTimelineDrawsOverlapOutsideWindow(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	leases := []LeaseRecord{
		{Instance: "r1", Key: "sku/hot", Token: 1, AcquiredAt: at(100), ReleasedAt: at(400)},
		{Instance: "r2", Key: "sku/hot", Token: 2, AcquiredAt: at(300), ReleasedAt: at(500)}, // two holders, 300 to 400 ms
		{Instance: "r3", Key: "sku/hot", Token: 3, AcquiredAt: at(1000), ReleasedAt: at(1100)},
		{Instance: "r1", Key: "sku/hot", Token: 4, AcquiredAt: at(1150), ReleasedAt: at(1250)},
	}
	events := []FaultEvent{{At: at(1100), Text: "Redis killed", Fired: true}, {At: at(1200), Text: "Redis back"}}
	tl := BuildTimeline(t0, "", events, leases, nil)
	if tl.Key != "sku/hot" || len(tl.Overlaps) != 1 {
		t.Fatalf("timeline of %s from %v to %v ms has %d overlaps, want the one at 300 ms", tl.Key, tl.FromMS, tl.ToMS, len(tl.Overlaps))
	}
	if o := tl.Overlaps[0]; o.FromMS < tl.FromMS || o.ToMS > tl.ToMS {
		t.Errorf("overlap %v to %v ms outside the span drawn, %v to %v ms", o.FromMS, o.ToMS, tl.FromMS, tl.ToMS)
	}
}

// TestStaleWrite: a write is stale when another replica was granted the
// lock after its writer was, before the write; by grant time, so a lock
// server restarted empty (tokens from 1 again) does not make the new
// holder's write the stale one.
func TestStaleWrite(t *testing.T) {
	tl := &Timeline{Leases: []TimedLease{
		{Instance: "r3", Token: 2, Interval: Interval{FromMS: 0, ToMS: 170}, Lost: true},
		{Instance: "r1", Token: 1, Interval: Interval{FromMS: 130, ToMS: 175}}, // Redis restarted empty
		{Instance: "r2", Token: 7, Interval: Interval{FromMS: 300, ToMS: 320}},
	}}
	for _, tc := range []struct {
		w     TimedWrite
		stale bool
	}{
		{TimedWrite{Instance: "r3", Token: 2, AtMS: 100}, false}, // alone
		{TimedWrite{Instance: "r3", Token: 2, AtMS: 168}, true},  // r1 granted since
		{TimedWrite{Instance: "r1", Token: 1, AtMS: 170}, false}, // the newer holder
		{TimedWrite{Instance: "r2", Token: 7, AtMS: 310}, false},
	} {
		if got := staleWrite(tl, tc.w); got != tc.stale {
			t.Errorf("%s's write with token %d at %v ms: stale %v, want %v", tc.w.Instance, tc.w.Token, tc.w.AtMS, got, tc.stale)
		}
	}
}
