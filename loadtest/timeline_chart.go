package loadtest

import (
	"fmt"
	"html/template"
	"math"
	"slices"
	"strings"
)

// textWidth estimates the width in px of s in the charts' font at size px:
// enough for layout (labels sized from the longest, tokens drawn only where
// they fit) without a font at hand.
func textWidth(s string, size float64) float64 {
	return float64(len([]rune(s))) * size * 0.6
}

// timelineChart draws a fault run's lease timeline: time across, a lane per
// replica, each lease from grant to release or loss with its token, the
// fault's window shaded, writes committed or refused, overlaps outlined.
// The data attributes are docs/design.md's, for tools and tests.
func timelineChart(r Result) template.HTML {
	tl := r.Timeline
	// A lane: its lease bar at mid, writes below it, a stale write's
	// outcome in words below that.
	const laneH, mid, top, right = 50, 16, 78, 30
	labelW := 0.0
	for _, l := range tl.Lanes {
		labelW = math.Max(labelW, textWidth(l, 12))
	}
	left := math.Ceil(labelW) + 16
	height := top + laneH*len(tl.Lanes) + 34
	span := math.Max(tl.ToMS-tl.FromMS, 1)
	plotW := float64(chartWidth) - left - right
	x := func(ms float64) float64 {
		return left + (math.Min(math.Max(ms, tl.FromMS), tl.ToMS)-tl.FromMS)/span*plotW
	}
	lane := map[string]int{}
	for i, l := range tl.Lanes {
		lane[l] = i
	}
	laneY := func(name string) int { return top + lane[name]*laneH }
	bottom := top + laneH*len(tl.Lanes)

	var b strings.Builder
	title := fmt.Sprintf("Who held %s, and whose write landed", tl.Key)
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s" data-chart="timeline" data-run="%s" data-seed="%d">`,
		chartWidth, height, chartWidth, height, esc(r.Name()+": "+title), esc(r.Name()), r.Seed)
	b.WriteString(timelineStyle)
	fmt.Fprintf(&b, `<text x="4" y="16" class="title">%s</text>`, esc(fitText(title, 14, chartWidth-8)))
	timelineLegend(&b, 4, 36)

	if w := tl.Fault; w != nil {
		x0, x1 := x(w.FromMS), x(w.ToMS)
		fmt.Fprintf(&b, `<rect data-fault-window="" x="%.1f" y="%d" width="%.1f" height="%d" class="fault-window"><title>%s: %s to %s</title></rect>`,
			x0, top-8, math.Max(x1-x0, 2), bottom-top+8, esc(r.Fault), seconds(w.FromMS), seconds(w.ToMS))
		label := r.Fault
		lx, anchor := x0+3, "start"
		if lx+textWidth(label, 11) > float64(chartWidth-4) {
			lx, anchor = math.Min(x1, float64(chartWidth-4)), "end"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="%s" class="value">%s</text>`, lx, top-12, anchor, esc(label))
	}
	for _, t := range ticksBetween(tl.FromMS, tl.ToMS) {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" class="grid"/>`, x(t), top-4, x(t), bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" class="value">%s s</text>`, x(t), bottom+14, num(t/1000))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" class="unit">seconds after the load began</text>`, chartWidth-4, bottom+29)

	for _, o := range tl.Overlaps {
		ya, yb := laneY(o.A), laneY(o.B)
		y0, y1 := min(ya, yb), max(ya, yb)+laneH
		x0, x1 := x(o.FromMS), x(o.ToMS)
		fmt.Fprintf(&b, `<rect data-overlap="" x="%.1f" y="%d" width="%.1f" height="%d" class="overlap"><title>two holders: %s (token %d) and %s (token %d), %s to %s</title></rect>`,
			math.Min(x0, x1-6), y0+2, math.Max(x1-x0, 6), y1-y0-4, esc(o.A), o.TokenA, esc(o.B), o.TokenB, seconds(o.FromMS), seconds(o.ToMS))
	}
	for _, name := range tl.Lanes {
		y := laneY(name)
		fmt.Fprintf(&b, `<g data-lane="%s">`, esc(name))
		labelEnd := 0.0 // where the lane's last token label ends
		var starts []float64
		for _, l := range tl.Leases {
			if l.Instance == name {
				starts = append(starts, x(l.FromMS))
			}
		}
		free := func(from, to float64) bool { // no lease of the lane starts there
			return !slices.ContainsFunc(starts, func(s float64) bool { return s > from && s < to })
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="end" class="label">%s</text>`, left-8, y+mid+4, esc(name))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%d" y2="%d" class="axis"/>`, left, y+mid, chartWidth-right, y+mid)
		for _, l := range tl.Leases {
			if l.Instance != name {
				continue
			}
			x0, x1 := x(l.FromMS), x(l.ToMS)
			w := math.Max(x1-x0, 4) // a lease of a few ms stays visible
			class, how := "lease", "released"
			if l.Lost {
				class, how = "lease lost", "lost"
			}
			fmt.Fprintf(&b, `<rect data-lease="" data-token="%d" x="%.1f" y="%d" width="%.1f" height="16" class="%s"><title>%s token %d: granted %s, %s %s</title></rect>`,
				l.Token, x0, y+mid-8, w, class, esc(name), l.Token, seconds(l.FromMS), how, seconds(l.ToMS))
			// The token inside the lease, or right of a short one where the
			// lane has room and no label of the lane's is there yet.
			label := fmt.Sprintf("token %d", l.Token)
			switch tw := textWidth(label, 11); {
			case tw+6 <= w && x0+w/2-tw/2 > labelEnd:
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" class="token">%s</text>`, x0+w/2, y+mid+4, label)
				labelEnd = x0 + w/2 + tw/2 + 4
			case x0+w+4 > labelEnd && x0+w+4+tw <= float64(chartWidth-4) && free(x0+w, x0+w+8+tw):
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="token">%s</text>`, x0+w+4, y+mid-3, label)
				labelEnd = x0 + w + 8 + tw
			}
		}
		wordsEnd := 0.0 // where the lane's last outcome in words ends
		for _, wr := range tl.Writes {
			if wr.Instance != name {
				continue
			}
			cx, cy := x(wr.AtMS), y+mid+14
			stale := staleWrite(tl, wr)
			tip := fmt.Sprintf("%s's write with token %d %s at %s (%d %s)", name, wr.Token, wr.Outcome, seconds(wr.AtMS), wr.Orders, plural(wr.Orders, "order", "orders"))
			if stale {
				tip += ": another replica had been granted the lock since, the write is stale"
			}
			if wr.Outcome == "refused" {
				fmt.Fprintf(&b, `<path data-write="refused" d="M%.1f %dl8 8m0 -8l-8 8" class="refused"><title>%s</title></path>`, cx-4, cy-4, esc(tip))
			} else {
				fmt.Fprintf(&b, `<circle data-write="committed" cx="%.1f" cy="%d" r="3.5" class="committed"><title>%s</title></circle>`, cx, cy, esc(tip))
			}
			// The outcome of a stale write, and of any refused one, in
			// words under its mark, where the lane has room.
			words, class := "", ""
			switch {
			case stale && wr.Outcome == "committed":
				words, class = "stale write committed", "stale-committed"
			case wr.Outcome == "refused":
				words, class = "refused", "stale-refused"
				if stale {
					words = "stale write refused"
				}
			}
			if words == "" {
				continue
			}
			tw := textWidth(words, 11)
			lx := math.Min(math.Max(cx-tw/2, left), float64(chartWidth-4)-tw)
			if lx < wordsEnd {
				continue
			}
			fmt.Fprintf(&b, `<text data-write-words="%s" x="%.1f" y="%d" class="%s">%s</text>`, wr.Outcome, lx, cy+15, class, words)
			wordsEnd = lx + tw + 8
		}
		b.WriteString(`</g>`)
	}
	for _, e := range tl.Events {
		if e.AtMS < tl.FromMS || e.AtMS > tl.ToMS {
			continue
		}
		fmt.Fprintf(&b, `<path d="M%.1f %dl-4 -7h8z" class="event"><title>%s: %s</title></path>`, x(e.AtMS), top-1, seconds(e.AtMS), esc(e.Text))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// staleWrite: another replica was granted the lock after w's writer was
// and before w, so w's writer no longer held it alone. By grant time, not
// by token: a lock server restarted empty hands out small tokens again.
func staleWrite(tl *Timeline, w TimedWrite) bool {
	own, found := 0.0, false // when w's writer was granted the lease it wrote with
	for _, l := range tl.Leases {
		if l.Instance == w.Instance && l.Token == w.Token && l.FromMS <= w.AtMS && (!found || l.FromMS > own) {
			own, found = l.FromMS, true
		}
	}
	if !found {
		return false // its lease began before the span drawn: nothing to compare
	}
	return slices.ContainsFunc(tl.Leases, func(l TimedLease) bool {
		return l.Instance != w.Instance && l.FromMS > own && l.FromMS <= w.AtMS
	})
}

// timelineStyle goes inside each timeline, so that the SVG file the lab
// writes beside the report looks the same on its own.
const timelineStyle = `<style>
text { font-family: system-ui, sans-serif; }
.title { font-weight: 600; font-size: 14px; fill: #111827; }
.label { font-size: 12px; fill: #111827; }
.value, .unit { font-size: 11px; fill: #4b5563; }
.token { font-size: 11px; fill: #1e3a8a; }
.axis { stroke: #9ca3af; }
.grid { stroke: #e5e7eb; }
.lease { fill: #bfdbfe; stroke: #2563eb; stroke-width: 1; }
.lease.lost { fill: #fed7aa; stroke: #c2410c; }
.overlap { fill: #dc2626; fill-opacity: .14; stroke: #dc2626; stroke-width: 1.5; }
.fault-window { fill: #fde68a; fill-opacity: .55; }
.committed { fill: #15803d; }
.refused { stroke: #b91c1c; stroke-width: 2.4; fill: none; }
.stale-committed { font-size: 11px; font-weight: 600; fill: #b91c1c; }
.stale-refused { font-size: 11px; fill: #15803d; }
.event { fill: #92400e; }
</style>`

// TimelineFile is the file name of r's timeline in the report folder's
// timelines/ directory: "redis-none+pause-holder-seed1.svg".
func TimelineFile(r Result) string {
	return fmt.Sprintf("%s-seed%d.svg", strings.ReplaceAll(r.Name(), "/", "-"), r.Seed)
}

// timelineLegend names the marks, on one row from (x, y).
func timelineLegend(b *strings.Builder, x, y int) {
	items := []struct{ mark, name string }{
		{`<rect x="%d" y="%d" width="14" height="9" class="lease"/>`, "lease (token)"},
		{`<rect x="%d" y="%d" width="14" height="9" class="lease lost"/>`, "lease seen lost"},
		{`<rect x="%d" y="%d" width="14" height="9" class="overlap"/>`, "two holders"},
		{`<rect x="%d" y="%d" width="14" height="9" class="fault-window"/>`, "fault window"},
		{`<circle cx="%d" cy="%d" r="3.5" class="committed"/>`, "write committed"},
		{`<path d="M%d %dl8 8m0 -8l-8 8" class="refused"/>`, "write refused"},
	}
	for i, it := range items {
		mx, my := x, y
		switch i {
		case 4:
			mx, my = x+7, y+5
		case 5:
			mx, my = x+3, y+1
		}
		fmt.Fprintf(b, it.mark, mx, my)
		fmt.Fprintf(b, `<text x="%d" y="%d" class="value">%s</text>`, x+19, y+9, it.name)
		x += 19 + int(textWidth(it.name, 11)) + 14
	}
}

// fitText cuts s to fit width px at size px, with an ellipsis; the whole
// text stays in the chart's aria-label.
func fitText(s string, size, width float64) string {
	if textWidth(s, size) <= width {
		return s
	}
	r := []rune(s)
	n := int(width/(size*0.6)) - 1
	return string(r[:max(n, 1)]) + "…"
}

// ticksBetween returns round tick values within [from, to].
func ticksBetween(from, to float64) []float64 {
	step := ticks(to - from)
	if len(step) < 2 {
		return nil
	}
	d := step[1]
	var out []float64
	for t := math.Ceil(from/d) * d; t <= to; t += d {
		out = append(out, math.Round(t*1e3)/1e3)
	}
	return out
}
