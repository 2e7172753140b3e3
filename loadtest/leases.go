package loadtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// LeaseRecord is one lease a replica held, from the line it logs when it is
// done with it (order.LeaseRecord). A lease ends at ReleasedAt, or at LostAt
// when the holder saw it lost first.
type LeaseRecord struct {
	Instance   string    `json:"instance"`
	Key        string    `json:"key"`
	Token      uint64    `json:"token"`
	AcquiredAt time.Time `json:"acquired_at"`
	ReleasedAt time.Time `json:"released_at"`
	LostAt     time.Time `json:"lost_at"`
	Lost       bool      `json:"lost"`
}

// End is when the holder stopped believing it held the lease.
func (l LeaseRecord) End() time.Time {
	if l.Lost && !l.LostAt.IsZero() {
		return l.LostAt
	}
	return l.ReleasedAt
}

// WriteRecord is one guarded write a replica settled, from the line it logs
// (order.WriteRecord): committed, or refused by the guard.
type WriteRecord struct {
	Instance string    `json:"instance"`
	At       time.Time `json:"time"`
	SKU      string    `json:"sku"`
	Token    uint64    `json:"token"`
	Orders   int       `json:"orders"`
	Outcome  string    `json:"outcome"` // "committed" or "refused"
}

// Batches is how the replicas sold, from their write records: committed
// guarded writes (one per transaction: with coalescing on, one per batch
// of orders), the orders they carried, how many carried more than one,
// and the most one carried.
type Batches struct {
	Writes  int `json:"writes"`
	Orders  int `json:"orders"`
	Multi   int `json:"multi"`
	Largest int `json:"largest"`
}

// BatchesOf sums the committed writes; nil when there are none (refused
// writes sold nothing: their orders were retried or answered).
func BatchesOf(writes []WriteRecord) *Batches {
	var b Batches
	for _, w := range writes {
		if w.Outcome != "committed" {
			continue
		}
		b.Writes++
		b.Orders += w.Orders
		if w.Orders > 1 {
			b.Multi++
		}
		b.Largest = max(b.Largest, w.Orders)
	}
	if b.Writes == 0 {
		return nil
	}
	return &b
}

// The msg of the record lines (order.LeaseRecord, order.WriteRecord).
const (
	leaseMsg = "lease"
	writeMsg = "write"
)

// ReadRecords reads every lease and write record from the *.log files in
// dir (the replicas' JSON stderr); other lines are skipped.
func ReadRecords(dir string) ([]LeaseRecord, []WriteRecord, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return nil, nil, err
	}
	var leases []LeaseRecord
	var writes []WriteRecord
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Bytes()
			if !bytes.HasPrefix(line, []byte("{")) {
				continue
			}
			switch {
			case bytes.Contains(line, []byte(`"msg":"lease"`)):
				var rec struct {
					Msg string `json:"msg"`
					LeaseRecord
				}
				if json.Unmarshal(line, &rec) == nil && rec.Msg == leaseMsg && rec.Key != "" {
					leases = append(leases, rec.LeaseRecord)
				}
			case bytes.Contains(line, []byte(`"msg":"write"`)):
				var rec struct {
					Msg string `json:"msg"`
					WriteRecord
				}
				if json.Unmarshal(line, &rec) == nil && rec.Msg == writeMsg && rec.SKU != "" {
					writes = append(writes, rec.WriteRecord)
				}
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("records: %s: %w", name, err)
		}
	}
	return leases, writes, nil
}

// Overlap is two leases on one key that two replicas held at once.
type Overlap struct {
	Key    string
	A, B   LeaseRecord // A acquired first
	Length time.Duration
}

func (o Overlap) String() string {
	return fmt.Sprintf("%s: %s (token %d) and %s (token %d) both held it for %s",
		o.Key, o.A.Instance, o.A.Token, o.B.Instance, o.B.Token, o.Length.Round(time.Millisecond))
}

// Overlaps finds every pair of leases on the same key, from different
// replicas, whose [acquired, end] intervals intersect. The replicas run on
// one machine and read one clock, so the intervals compare directly. A
// replica records acquired_at after its grant and released_at before it
// asks the server to free the lease, so a normal hand-over never overlaps.
func Overlaps(leases []LeaseRecord) []Overlap {
	byKey := map[string][]LeaseRecord{}
	for _, l := range leases {
		byKey[l.Key] = append(byKey[l.Key], l)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []Overlap
	for _, k := range keys {
		ls := byKey[k]
		slices.SortFunc(ls, func(a, b LeaseRecord) int { return a.AcquiredAt.Compare(b.AcquiredAt) })
		for j, b := range ls {
			for _, a := range ls[:j] {
				if a.Instance == b.Instance || !a.End().After(b.AcquiredAt) {
					continue
				}
				end := a.End()
				if b.End().Before(end) {
					end = b.End()
				}
				out = append(out, Overlap{Key: k, A: a, B: b, Length: end.Sub(b.AcquiredAt)})
			}
		}
	}
	return out
}
