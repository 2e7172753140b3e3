package loadtest

import (
	"testing"
	"time"
)

func TestHandoffs(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	leases := []LeaseRecord{
		{Instance: "r1", Key: "k", AcquiredAt: at(0), ReleasedAt: at(10)},
		{Instance: "r2", Key: "k", AcquiredAt: at(12), ReleasedAt: at(20)},         // 2 ms after r1
		{Instance: "r2", Key: "k", AcquiredAt: at(21), ReleasedAt: at(30)},         // same replica: not a handoff
		{Instance: "r3", Key: "k", AcquiredAt: at(36), LostAt: at(40), Lost: true}, // 6 ms
		{Instance: "r1", Key: "k", AcquiredAt: at(44), ReleasedAt: at(50)},         // 4 ms after r3's loss
		{Instance: "r2", Key: "j", AcquiredAt: at(0), ReleasedAt: at(100)},         // another key
	}
	w := Handoffs(leases)
	if w == nil || w.Count != 3 || w.P50 != 4 || w.Mean != 4 || w.P99 != 6 {
		t.Fatalf("Handoffs = %+v, want 3 handoffs of 2, 4 and 6 ms", w)
	}
	if Handoffs(leases[:1]) != nil {
		t.Error("one lease is no handoff")
	}
}
