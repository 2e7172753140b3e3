package loadtest

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Timeline is one fault run's lease history on its contested lock, around
// the fault: what the report's lease timeline draws. Times are milliseconds
// after the run's load began, so it reads the same from results.json.
type Timeline struct {
	Key    string  `json:"key"` // the lock key drawn, "sku/..."
	FromMS float64 `json:"from_ms"`
	ToMS   float64 `json:"to_ms"`
	// Fault is the fault's window: from the moment it struck to its last
	// event (nil when it never struck).
	Fault    *Interval      `json:"fault_window,omitempty"`
	Lanes    []string       `json:"lanes"` // every replica of the run
	Leases   []TimedLease   `json:"leases"`
	Writes   []TimedWrite   `json:"writes"`
	Overlaps []TimedOverlap `json:"overlaps"`
	Events   []TimedEvent   `json:"events"`
}

// Interval is a stretch of a timeline, in ms after the load began.
type Interval struct {
	FromMS float64 `json:"from_ms"`
	ToMS   float64 `json:"to_ms"`
}

// TimedLease is a lease from its grant to its release, or to the moment its
// holder saw it lost.
type TimedLease struct {
	Instance string `json:"instance"`
	Token    uint64 `json:"token"`
	Interval
	Lost bool `json:"lost,omitempty"`
}

// TimedWrite is a guarded write of the contested SKU.
type TimedWrite struct {
	Instance string  `json:"instance"`
	AtMS     float64 `json:"at_ms"`
	Token    uint64  `json:"token"`
	Orders   int     `json:"orders"`
	Outcome  string  `json:"outcome"` // committed or refused
}

// TimedOverlap is a stretch when two replicas both held the lock.
type TimedOverlap struct {
	A, B           string // instances, A granted first
	TokenA, TokenB uint64
	Interval
}

// TimedEvent is a fault event; Fired marks the moment it struck.
type TimedEvent struct {
	AtMS  float64 `json:"at_ms"`
	Text  string  `json:"text"`
	Fired bool    `json:"fired,omitempty"`
}

// timelineMargin is the least time drawn before and after the fault window.
const timelineMargin = 300 * time.Millisecond

// BuildTimeline picks the lock the fault contested and the span around the
// fault to draw: the key of an overlap if two holders overlapped, else the
// fault's own SKU if it was locked, else the key most locked in the window.
func BuildTimeline(origin time.Time, faultSKU string, events []FaultEvent, leases []LeaseRecord, writes []WriteRecord) *Timeline {
	ms := func(t time.Time) float64 { return math.Round(float64(t.Sub(origin))/1e5) / 10 }
	tl := &Timeline{}
	lanes := map[string]bool{}
	for _, l := range leases {
		lanes[l.Instance] = true
	}
	for _, w := range writes {
		lanes[w.Instance] = true
	}
	for name := range lanes {
		tl.Lanes = append(tl.Lanes, name)
	}
	slices.SortFunc(tl.Lanes, func(a, b string) int { return cmp.Or(cmp.Compare(len(a), len(b)), cmp.Compare(a, b)) })

	// The window: from the strike (or the first event) to the last event.
	var from, to time.Time
	for _, e := range events {
		tl.Events = append(tl.Events, TimedEvent{AtMS: ms(e.At), Text: e.Text, Fired: e.Fired})
		if e.Fired && (from.IsZero() || e.At.Before(from)) {
			from = e.At
		}
		if e.At.After(to) {
			to = e.At
		}
	}
	if from.IsZero() && len(events) > 0 {
		from = events[0].At
	}
	if !from.IsZero() {
		tl.Fault = &Interval{FromMS: ms(from), ToMS: ms(to)}
	}

	overlaps := Overlaps(leases)
	switch {
	case len(overlaps) > 0:
		tl.Key = overlaps[0].Key
		if from.IsZero() {
			from, to = overlaps[0].B.AcquiredAt, overlaps[0].B.AcquiredAt.Add(overlaps[0].Length)
		}
	case slices.ContainsFunc(leases, func(l LeaseRecord) bool { return faultSKU != "" && l.Key == "sku/"+faultSKU }):
		tl.Key = "sku/" + faultSKU
	default:
		counts := map[string]int{}
		for _, l := range leases {
			if from.IsZero() || (l.End().After(from) && l.AcquiredAt.Before(to)) {
				counts[l.Key]++
			}
		}
		for k, n := range counts {
			if n > counts[tl.Key] || (n == counts[tl.Key] && k < tl.Key) {
				tl.Key = k
			}
		}
	}
	if from.IsZero() { // no event, no overlap: the start of the load
		from, to = origin, origin.Add(2*time.Second)
	}

	// The span: the window with a margin, stretched over the leases of the
	// key that the window cuts, up to once more the window's length.
	pad := max(to.Sub(from)/6, timelineMargin)
	lo, hi := from.Add(-pad), to.Add(pad)
	stretch := max(to.Sub(from), time.Second)
	for _, l := range leases {
		if l.Key != tl.Key || !l.End().After(from) || !l.AcquiredAt.Before(to) {
			continue
		}
		if l.AcquiredAt.Before(lo) {
			lo = later(l.AcquiredAt.Add(-pad/2), from.Add(-stretch))
		}
		if l.End().After(hi) {
			hi = earlier(l.End().Add(pad/2), to.Add(stretch))
		}
	}
	// Two holders on the key drawn are what the run counts: draw them even
	// when they overlapped outside the fault's window.
	for _, o := range overlaps {
		if o.Key != tl.Key {
			continue
		}
		if o.B.AcquiredAt.Before(lo) {
			lo = o.B.AcquiredAt.Add(-pad / 2)
		}
		if end := o.B.AcquiredAt.Add(o.Length); end.After(hi) {
			hi = end.Add(pad / 2)
		}
	}
	lo = later(lo, origin)
	tl.FromMS, tl.ToMS = ms(lo), ms(hi)

	sku := strings.TrimPrefix(tl.Key, "sku/")
	var onKey []LeaseRecord
	for _, l := range leases {
		if l.Key == tl.Key && l.End().After(lo) && l.AcquiredAt.Before(hi) {
			onKey = append(onKey, l)
			tl.Leases = append(tl.Leases, TimedLease{Instance: l.Instance, Token: l.Token, Lost: l.Lost,
				Interval: Interval{FromMS: ms(l.AcquiredAt), ToMS: ms(l.End())}})
		}
	}
	slices.SortFunc(tl.Leases, func(a, b TimedLease) int { return cmp.Compare(a.FromMS, b.FromMS) })
	for _, w := range writes {
		if w.SKU == sku && !w.At.Before(lo) && !w.At.After(hi) {
			tl.Writes = append(tl.Writes, TimedWrite{Instance: w.Instance, AtMS: ms(w.At), Token: w.Token, Orders: w.Orders, Outcome: w.Outcome})
		}
	}
	slices.SortFunc(tl.Writes, func(a, b TimedWrite) int { return cmp.Compare(a.AtMS, b.AtMS) })
	for _, o := range Overlaps(onKey) {
		tl.Overlaps = append(tl.Overlaps, TimedOverlap{A: o.A.Instance, B: o.B.Instance, TokenA: o.A.Token, TokenB: o.B.Token,
			Interval: Interval{FromMS: ms(o.B.AcquiredAt), ToMS: ms(o.B.AcquiredAt.Add(o.Length))}})
	}
	return tl
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// StoryLine is one timed line of a fault run's story.
type StoryLine struct {
	At   string // "+2.31 s", or "" for the outcome
	Text string
	Kind string // "fault", "overlap", "refused", "outcome"
}

// StoryLines tells a fault run as timed events: what the fault did, when
// two holders overlapped and which writes the guard refused, then what the
// invariants found.
func (r Result) StoryLines() []StoryLine {
	var out []StoryLine
	type timed struct {
		at float64
		StoryLine
	}
	var ts []timed
	if tl := r.Timeline; tl != nil {
		for _, e := range tl.Events {
			kind := "event"
			if e.Fired {
				kind = "fault"
			}
			ts = append(ts, timed{e.AtMS, StoryLine{Text: e.Text, Kind: kind}})
		}
		for _, o := range tl.Overlaps {
			ts = append(ts, timed{o.FromMS, StoryLine{Kind: "overlap", Text: fmt.Sprintf("%s (token %d) and %s (token %d) both hold %s, for %s",
				o.A, o.TokenA, o.B, o.TokenB, tl.Key, seconds(o.ToMS-o.FromMS))}})
		}
		refused := 0
		for _, w := range tl.Writes {
			if w.Outcome != "refused" {
				continue
			}
			if refused++; refused <= 5 {
				ts = append(ts, timed{w.AtMS, StoryLine{Kind: "refused", Text: fmt.Sprintf("guard %s refuses %s's write (token %d)", r.Guard, w.Instance, w.Token)}})
			}
		}
	} else {
		for _, e := range r.FaultEvents {
			out = append(out, StoryLine{Text: e, Kind: "event"})
		}
	}
	slices.SortStableFunc(ts, func(a, b timed) int { return cmp.Compare(a.at, b.at) })
	for _, t := range ts {
		t.At = seconds(t.at)
		if t.at >= 0 {
			t.At = "+" + t.At
		}
		out = append(out, t.StoryLine)
	}
	if why := refusals(r); why != "" {
		out = append(out, StoryLine{Kind: "why", Text: why})
	}
	var end []string
	if r.NotFired {
		end = append(end, "the fault did not fire: the run says nothing about "+r.Fault)
	}
	if r.StaleWritesRefused > 0 {
		end = append(end, fmt.Sprintf("guard %s refused %d stale %s in the run", r.Guard, r.StaleWritesRefused, plural(r.StaleWritesRefused, "write", "writes")))
	}
	if r.RecoveryMS != nil {
		end = append(end, fmt.Sprintf("orders resumed after %s ms", num(*r.RecoveryMS)))
	}
	switch {
	case r.Safe:
		end = append(end, "safe: no oversell, no lost update, nothing acknowledged lost")
	case r.Error != "":
		end = append(end, r.Verdict())
	default:
		end = append(end, "unsafe: "+damage(r))
	}
	return append(out, StoryLine{Kind: "outcome", Text: strings.Join(end, "; ")})
}

// seconds prints milliseconds as seconds: "2.31 s", "0.05 s".
func seconds(ms float64) string {
	s := ms / 1000
	switch {
	case math.Abs(s) >= 10:
		return fmt.Sprintf("%.1f s", s)
	default:
		return fmt.Sprintf("%.2f s", s)
	}
}
