package loadtest

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"slices"
	"strings"
)

// Charts are plain inline SVG, drawn here: the report opens offline, with no
// script and no CDN.

const (
	chartWidth = 760
	// barWidth is narrower: bar charts shrink less on a phone.
	barWidth   = 600
	valueWidth = 56 // room for the value right of the longest bar
)

// series is one set of bars, one value per label.
type series struct {
	name   string
	color  string
	values []float64
}

// Runs are coloured by verdict: blue where every invariant held, red where
// one broke; a chart's second series is a lighter shade of the same.
var verdictColors = map[bool][2]string{
	true:  {"#2563eb", "#93c5fd"},
	false: {"#dc2626", "#fca5a5"},
}

// verdictWord names a verdict colour in legends and data attributes.
func verdictWord(safe bool) string {
	if safe {
		return "safe"
	}
	return "unsafe"
}

// bars is a bar chart's runs: a name and a verdict each.
type bars struct {
	id     string // data-chart
	labels []string
	safe   []bool
	// safeKey, if set, is the one legend entry for the runs that kept
	// every invariant, whatever the series (their bars are 0).
	safeKey string
}

// barChart draws horizontal bars: one group per run, one bar per series,
// each bar in its run's verdict colour (the series' shade), and a legend
// naming both.
func barChart(title, unit string, runs bars, ss []series) template.HTML {
	// The legend: a swatch per series and verdict present.
	var keys []series
	for _, safe := range []bool{true, false} {
		if !slices.Contains(runs.safe, safe) {
			continue
		}
		if safe && runs.safeKey != "" {
			keys = append(keys, series{name: runs.safeKey, color: verdictColors[true][0]})
			continue
		}
		for j, s := range ss {
			name := "kept every invariant"
			if !safe {
				name = "broke an invariant"
			}
			if len(ss) > 1 {
				name = s.name + ", " + name
			}
			keys = append(keys, series{name: name, color: verdictColors[safe][min(j, 1)]})
		}
	}
	// Two drawings, one shown at a time (report.html.tmpl): run names left
	// of the bars on a screen, above them on a phone, where the chart is
	// drawn at the phone's width and its text stays readable.
	return template.HTML(`<div class="chart-wide">` + drawBars(title, unit, runs, ss, keys, barWidth, false) +
		`</div><div class="chart-narrow">` + drawBars(title, unit, runs, ss, keys, narrowWidth, true) + `</div>`)
}

// narrowWidth is a phone's width for a bar chart.
const narrowWidth = 360

// drawBars draws a bar chart width px wide, each run's name left of its
// bars, or above them when stacked.
func drawBars(title, unit string, runs bars, ss []series, keys []series, width int, stacked bool) string {
	const bar, gap = 14, 10
	labels := runs.labels
	titles := wrapText(title, 14, float64(width-8))
	top := 12 + 17*len(titles) + 14*legendRows(keys, 4, width)
	group := bar*len(ss) + gap
	if stacked {
		group += 15 // the run's name on a line of its own
	}
	height := top + 8 + group*len(labels) + 24
	maxV := 0.0
	for _, s := range ss {
		for _, v := range s.values {
			maxV = math.Max(maxV, v)
		}
	}
	// Run names left of the bars, as wide as the longest needs.
	labelWidth := 4
	if !stacked {
		lw := 0.0
		for _, l := range labels {
			lw = math.Max(lw, textWidth(l, 12))
		}
		labelWidth = int(math.Ceil(lw)) + 14
	}
	span := float64(width - labelWidth - valueWidth)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s" data-chart="%s">`,
		width, height, width, height, esc(title), esc(runs.id))
	for i, t := range titles {
		fmt.Fprintf(&b, `<text x="4" y="%d" class="title">%s</text>`, 16+17*i, esc(t))
	}
	legend(&b, keys, 4, top-14*legendRows(keys, 4, width)-4, width)
	for i, label := range labels {
		y := top + 8 + i*group
		verdict := verdictWord(runs.safe[i])
		fmt.Fprintf(&b, `<g data-run="%s" data-verdict="%s">`, esc(label), verdict)
		if stacked {
			fmt.Fprintf(&b, `<text x="%d" y="%d" class="label %s">%s</text>`, labelWidth, y+11, verdict, esc(fitText(label, 12, float64(width-8))))
			y += 15
		} else {
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" class="label %s">%s</text>`,
				labelWidth-8, y+bar*len(ss)/2+4, verdict, esc(label))
		}
		for j, s := range ss {
			v := s.values[i]
			w := 0.0
			if maxV > 0 {
				w = v / maxV * span
			}
			by := y + j*bar
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %s: %s %s (%s)</title></rect>`,
				labelWidth, by, math.Max(w, 1), bar-2, verdictColors[runs.safe[i]][min(j, 1)], esc(label), esc(s.name), num(v), esc(unit), verdict)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="value">%s</text>`, float64(labelWidth)+math.Max(w, 1)+4, by+bar-4, num(v))
		}
		b.WriteString(`</g>`)
	}
	if !stacked { // stacked, the axis would run through the names
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" class="axis"/>`, labelWidth, top+4, labelWidth, height-20)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" class="unit">%s</text>`, labelWidth, height-6, esc(unit))
	b.WriteString(`</svg>`)
	return b.String()
}

// wrapText breaks s into lines of at most width px at size px, at spaces.
func wrapText(s string, size, width float64) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		switch {
		case line == "":
			line = word
		case textWidth(line+" "+word, size) <= width:
			line += " " + word
		default:
			lines = append(lines, fitText(line, size, width))
			line = word
		}
	}
	return append(lines, fitText(line, size, width))
}

// line is one run's curve.
type line struct {
	name    string
	color   string
	verdict string // "safe" or "unsafe" for a run's curve; "" for other lines
	xs, ys  []float64
}

// smallMultiples draws each run's curve in a panel of its own, every
// panel on the same axes, so runs compare by position instead of by colour
// in one tangle.
func smallMultiples(id, title, xUnit, yUnit string, ls []line) template.HTML {
	// Three panels a row on a screen, two at a phone's width (the media
	// query of report.html.tmpl shows one of them).
	return template.HTML(`<div class="chart-wide">` + drawPanels(id, title, xUnit, yUnit, ls, chartWidth, 3) +
		`</div><div class="chart-narrow">` + drawPanels(id, title, xUnit, yUnit, ls, narrowWidth, 2) + `</div>`)
}

// drawPanels draws smallMultiples width px wide, cols panels a row.
func drawPanels(id, title, xUnit, yUnit string, ls []line, width, cols int) string {
	const gapX, gapY, panelH = 18, 34, 120
	const left, bottom = 44, 22 // room for the shared axes' labels
	titles := wrapText(title, 14, float64(width-8))
	// The verdicts' colours, when the curves are runs.
	var keys []series
	for _, safe := range []bool{true, false} {
		if slices.ContainsFunc(ls, func(l line) bool { return l.verdict == verdictWord(safe) }) {
			keys = append(keys, series{name: map[bool]string{true: "kept every invariant", false: "broke an invariant"}[safe], color: verdictColors[safe][0]})
		}
	}
	legendH := 0
	if len(keys) > 0 {
		legendH = 14 * legendRows(keys, 4, width)
	}
	top := 17*len(titles) + 17 + legendH
	maxX, maxY := 0.0, 0.0
	for _, l := range ls {
		for i := range l.xs {
			maxX, maxY = math.Max(maxX, l.xs[i]), math.Max(maxY, l.ys[i])
		}
	}
	xTicks, yTicks := ticks(maxX), ticks(maxY)
	maxX, maxY = xTicks[len(xTicks)-1], yTicks[len(yTicks)-1]
	panelW := float64(width-left-(cols-1)*gapX-8) / float64(cols)
	rows := (len(ls) + cols - 1) / cols
	height := top + rows*(panelH+gapY) + 8

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s" data-chart="%s">`,
		width, height, width, height, esc(title), esc(id))
	for i, t := range titles {
		fmt.Fprintf(&b, `<text x="4" y="%d" class="title">%s</text>`, 16+17*i, esc(t))
	}
	if len(keys) > 0 {
		legend(&b, keys, 4, 17*len(titles)+7, width)
	}
	for i, l := range ls {
		ox := left + float64(i%cols)*(panelW+gapX)
		oy := float64(top + (i/cols)*(panelH+gapY) + 16)
		ph := float64(panelH - bottom)
		px := func(x float64) float64 { return ox + x/maxX*panelW }
		py := func(y float64) float64 { return oy + ph - y/maxY*ph }
		if l.verdict != "" {
			fmt.Fprintf(&b, `<g data-panel="%s" data-run="%s" data-verdict="%s">`, esc(l.name), esc(l.name), l.verdict)
		} else {
			fmt.Fprintf(&b, `<g data-panel="%s">`, esc(l.name))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="label %s">%s<title>%s</title></text>`, ox, oy-5, l.verdict, esc(fitText(l.name, 12, panelW)), esc(l.name))
		for _, t := range yTicks {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="grid"/>`, ox, py(t), ox+panelW, py(t))
			if i%cols == 0 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" class="value">%s</text>`, ox-4, py(t)+4, num(t))
			}
		}
		for _, t := range []float64{0, maxX} {
			anchor := "start"
			if t > 0 {
				anchor = "end"
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="%s" class="value">%s %s</text>`, px(t), oy+ph+14, anchor, num(t), esc(xUnit))
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="axis"/>`, ox, oy+ph, ox+panelW, oy+ph)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="axis"/>`, ox, oy, ox, oy+ph)
		pts := make([]string, len(l.xs))
		for k := range l.xs {
			pts[k] = fmt.Sprintf("%.1f,%.1f", px(l.xs[k]), py(l.ys[k]))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.6"><title>%s</title></polyline></g>`,
			strings.Join(pts, " "), l.color, esc(l.name))
	}
	fmt.Fprintf(&b, `<text x="4" y="%d" class="unit">%s, all panels on the same axes</text>`, top-4, esc(yUnit))
	b.WriteString(`</svg>`)
	return b.String()
}

// legendRows is how many rows legend draws for ss from x.
func legendRows(ss []series, x, width int) int {
	rows, x0 := 1, x
	for _, s := range ss {
		w := 24 + int(textWidth(s.name, 11))
		if x+w > width && x > x0 {
			x, rows = x0, rows+1
		}
		x += w
	}
	return rows
}

// legend draws one swatch and name per series, on one row from (x, y),
// wrapping at the chart's edge (width).
func legend(b *strings.Builder, ss []series, x, y, width int) {
	x0 := x
	for _, s := range ss {
		w := 24 + int(textWidth(s.name, 11))
		if x+w > width && x > x0 {
			x, y = x0, y+14
		}
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d" class="value">%s</text>`,
			x, y, s.color, x+14, y+9, esc(s.name))
		x += w
	}
}

// ticks returns about five round tick values from 0 to at least maxV.
func ticks(maxV float64) []float64 {
	if maxV <= 0 {
		return []float64{0, 1}
	}
	raw := maxV / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for i := 0; ; i++ {
		t := math.Round(float64(i)*step*1e6) / 1e6 // 0.3, not 0.30000000000000004
		out = append(out, t)
		if t >= maxV {
			return out
		}
	}
}

// num prints a value without needless decimals.
func num(v float64) string {
	switch {
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func esc(s string) string { return html.EscapeString(s) }
