package loadtest

import (
	"fmt"
	"html/template"
	"math"
	"strings"
)

// backlogColors: the 202s, the outcomes MySQL took, the rejected among
// them, and the stream's sampled length.
var backlogColors = map[string]string{
	"accepted (202)":       "#2563eb",
	"settled in MySQL":     "#16a34a",
	"rejected":             "#d97706",
	"stream length (XLEN)": "#6b7280",
	"backlog (pending)":    "#dbeafe",
}

// queueCharts draws, for every queue run with a timeline, its backlog
// chart.
func queueCharts(results []Result) []template.HTML {
	var out []template.HTML
	for _, r := range results {
		if r.Accept == "queue" && len(r.QueueTimeline) > 0 {
			out = append(out, backlogChart(r))
		}
	}
	return out
}

// backlogChart draws a queue run's orders accepted and settled over time,
// counted from the run's start, on one pair of axes: the gap between the
// two curves is the backlog, the orders answered 202 and not yet written,
// that a customer waits behind. A second panel beneath, on its own scale,
// draws that backlog alone with the stream's sampled length: on a long run
// the gap is too thin to see beside the totals. Drawn once for a screen
// and once at a phone's width (report.html.tmpl shows one).
func backlogChart(r Result) template.HTML {
	return template.HTML(`<div class="chart-wide">` + drawBacklog(r, chartWidth) +
		`</div><div class="chart-narrow">` + drawBacklog(r, narrowWidth) + `</div>`)
}

// drawBacklog draws backlogChart width px wide.
func drawBacklog(r Result, width int) string {
	const plotH, lowH, gap, left, right, bottom = 180, 90, 46, 48, 12, 34
	title := r.Name() + ": orders accepted (202) and settled in MySQL over time; the shaded gap is the backlog a customer waits behind"
	if c := r.ConfirmMS; c != nil {
		title += fmt.Sprintf(" (202 to outcome: p50 %s ms, p99 %s ms)", num(c.P50), num(c.P99))
	}
	titles := wrapText(title, 14, float64(width-8))
	// Counts at the end of each slice: cumulative, and the backlog.
	n := len(r.QueueTimeline)
	xs := make([]float64, n+1)
	acc, set, rej, pend := make([]float64, n+1), make([]float64, n+1), make([]float64, n+1), make([]float64, n+1)
	step := 0.0
	if n > 1 {
		step = r.QueueTimeline[1].AtS - r.QueueTimeline[0].AtS
	}
	maxLen := 0.0
	hasLen := false
	for i, s := range r.QueueTimeline {
		xs[i+1] = s.AtS + step
		acc[i+1] = acc[i] + float64(s.Accepted)
		set[i+1] = set[i] + float64(s.Confirmed+s.Rejected)
		rej[i+1] = rej[i] + float64(s.Rejected)
		pend[i+1] = math.Max(acc[i+1]-set[i+1], 0)
		if s.StreamLen >= 0 {
			hasLen, maxLen = true, math.Max(maxLen, float64(s.StreamLen))
		}
	}
	keys := []series{{name: "accepted (202)"}, {name: "settled in MySQL"}, {name: "backlog (pending)"}}
	if rej[n] > 0 {
		keys = append(keys, series{name: "rejected"})
	}
	if hasLen {
		keys = append(keys, series{name: "stream length (XLEN)"})
	}
	for i := range keys {
		keys[i].color = backlogColors[keys[i].name]
	}
	top := 17*len(titles) + 8 + 14*legendRows(keys, 4, width) + 22
	lowTop := top + plotH + gap
	height := lowTop + lowH + bottom
	xTicks, yTicks := ticks(xs[n]), ticks(math.Max(acc[n], set[n]))
	maxPend := 0.0
	for _, v := range pend {
		maxPend = math.Max(maxPend, v)
	}
	lowTicks := ticks(math.Max(maxPend, maxLen))
	maxX := xTicks[len(xTicks)-1]
	plotW := float64(width - left - right)
	px := func(x float64) float64 { return float64(left) + x/maxX*plotW }
	type panel struct {
		top, h float64
		max    float64
	}
	upper := panel{float64(top), plotH, yTicks[len(yTicks)-1]}
	lower := panel{float64(lowTop), lowH, lowTicks[len(lowTicks)-1]}
	py := func(p panel, y float64) float64 { return p.top + p.h - y/p.max*p.h }
	points := func(p panel, ys []float64) []string {
		pts := make([]string, len(ys))
		for i := range ys {
			pts[i] = fmt.Sprintf("%.1f,%.1f", px(xs[i]), py(p, ys[i]))
		}
		return pts
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s" data-chart="queue-backlog" data-run="%s">`,
		width, height, width, height, esc(title), esc(r.Name()))
	for i, t := range titles {
		fmt.Fprintf(&b, `<text x="4" y="%d" class="title">%s</text>`, 16+17*i, esc(t))
	}
	legend(&b, keys, 4, 17*len(titles)+4, width)
	axes := func(p panel, ts []float64, label string) {
		fmt.Fprintf(&b, `<text x="4" y="%.1f" class="unit">%s</text>`, p.top-10, esc(label))
		for _, t := range ts {
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" class="grid"/>`, left, py(p, t), float64(left)+plotW, py(p, t))
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" class="value">%s</text>`, left-4, py(p, t)+4, num(t))
		}
	}
	axes(upper, yTicks, "orders, counted from the start")
	lowLabel := "backlog: orders pending"
	if hasLen {
		lowLabel += "; stream length (XLEN)"
	}
	axes(lower, lowTicks, fitText(lowLabel, 11, float64(width-8)))
	for i, t := range xTicks {
		anchor := "middle"
		switch i {
		case 0:
			anchor = "start"
		case len(xTicks) - 1:
			anchor = "end"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="%s" class="value">%s</text>`, px(t), lowTop+lowH+14, anchor, num(t))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="end" class="unit">seconds from the first request</text>`, float64(left)+plotW, lowTop+lowH+28)
	// The backlog: the area between the two curves, and alone beneath.
	settledBack := points(upper, set)
	for i, j := 0, len(settledBack)-1; i < j; i, j = i+1, j-1 {
		settledBack[i], settledBack[j] = settledBack[j], settledBack[i]
	}
	fmt.Fprintf(&b, `<polygon points="%s" fill="%s" data-series="backlog"><title>backlog: accepted, not yet settled</title></polygon>`,
		strings.Join(append(points(upper, acc), settledBack...), " "), backlogColors["backlog (pending)"])
	base := fmt.Sprintf("%.1f,%.1f %.1f,%.1f", px(xs[n]), py(lower, 0), px(0), py(lower, 0))
	fmt.Fprintf(&b, `<polygon points="%s %s" fill="%s" stroke="%s" stroke-width="1" data-series="pending"><title>backlog: at most %s orders pending</title></polygon>`,
		strings.Join(points(lower, pend), " "), base, backlogColors["backlog (pending)"], backlogColors["accepted (202)"], num(maxPend))
	curve := func(name, key string, ys []float64) {
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2" data-series="%s"><title>%s: %s by %s s</title></polyline>`,
			strings.Join(points(upper, ys), " "), backlogColors[key], name, esc(key), num(ys[len(ys)-1]), num(xs[len(xs)-1]))
	}
	curve("accepted", "accepted (202)", acc)
	curve("settled", "settled in MySQL", set)
	if rej[n] > 0 {
		curve("rejected", "rejected", rej)
	}
	if hasLen {
		var pts []string
		for i, s := range r.QueueTimeline {
			if s.StreamLen >= 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(xs[i+1]), py(lower, float64(s.StreamLen))))
			}
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5" stroke-dasharray="4 3" data-series="stream"><title>stream length (XLEN), sampled: at most %s</title></polyline>`,
			strings.Join(pts, " "), backlogColors["stream length (XLEN)"], num(maxLen))
	}
	for _, p := range []panel{upper, lower} {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" class="axis"/>`, left, py(p, 0), float64(left)+plotW, py(p, 0))
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" class="axis"/>`, left, p.top, left, py(p, 0))
	}
	b.WriteString(`</svg>`)
	return b.String()
}
