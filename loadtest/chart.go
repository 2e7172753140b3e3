package loadtest

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"strings"
)

// Charts are plain inline SVG, drawn here: the report opens offline, with no
// script and no CDN.

const (
	chartWidth = 760
	valueWidth = 70 // room for the value right of the longest bar
)

// palette colours runs and series; it repeats after ten.
var palette = []string{"#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed",
	"#0891b2", "#db2777", "#65a30d", "#475569", "#ea580c"}

// series is one set of bars, one value per label.
type series struct {
	name   string
	color  string
	values []float64
}

// barChart draws horizontal bars: one group per label, one bar per series.
func barChart(title, unit string, labels []string, ss []series) template.HTML {
	const bar, gap, top = 14, 10, 46
	group := bar*len(ss) + gap
	height := top + group*len(labels) + 24
	maxV := 0.0
	for _, s := range ss {
		for _, v := range s.values {
			maxV = math.Max(maxV, v)
		}
	}
	// Run names left of the bars, as wide as the longest needs.
	lw := 0.0
	for _, l := range labels {
		lw = math.Max(lw, textWidth(l, 12))
	}
	labelWidth := int(math.Ceil(lw)) + 14
	span := float64(chartWidth - labelWidth - valueWidth)
	var b strings.Builder
	svgOpen(&b, title, height)
	legend(&b, ss, labelWidth, 24)
	for i, label := range labels {
		y := top + i*group
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" class="label">%s</text>`,
			labelWidth-8, y+bar*len(ss)/2+4, esc(label))
		for j, s := range ss {
			v := s.values[i]
			w := 0.0
			if maxV > 0 {
				w = v / maxV * span
			}
			by := y + j*bar
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %s: %s %s</title></rect>`,
				labelWidth, by, math.Max(w, 1), bar-2, s.color, esc(label), esc(s.name), num(v), esc(unit))
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="value">%s</text>`, float64(labelWidth)+math.Max(w, 1)+4, by+bar-4, num(v))
		}
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" class="axis"/>`, labelWidth, top-4, labelWidth, height-20)
	fmt.Fprintf(&b, `<text x="%d" y="%d" class="unit">%s</text>`, labelWidth, height-6, esc(unit))
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// line is one run's curve.
type line struct {
	name   string
	color  string
	xs, ys []float64
}

// smallMultiples draws each run's curve in a panel of its own, every
// panel on the same axes, so runs compare by position instead of by colour
// in one tangle.
func smallMultiples(title, xUnit, yUnit string, ls []line) template.HTML {
	const cols, gapX, gapY, top, panelH = 3, 18, 34, 34, 120
	const left, bottom = 44, 22 // room for the shared axes' labels
	maxX, maxY := 0.0, 0.0
	for _, l := range ls {
		for i := range l.xs {
			maxX, maxY = math.Max(maxX, l.xs[i]), math.Max(maxY, l.ys[i])
		}
	}
	xTicks, yTicks := ticks(maxX), ticks(maxY)
	maxX, maxY = xTicks[len(xTicks)-1], yTicks[len(yTicks)-1]
	panelW := float64(chartWidth-left-(cols-1)*gapX-8) / cols
	rows := (len(ls) + cols - 1) / cols
	height := top + rows*(panelH+gapY) + 8

	var b strings.Builder
	svgOpen(&b, title, height)
	for i, l := range ls {
		ox := left + float64(i%cols)*(panelW+gapX)
		oy := float64(top + (i/cols)*(panelH+gapY) + 16)
		ph := float64(panelH - bottom)
		px := func(x float64) float64 { return ox + x/maxX*panelW }
		py := func(y float64) float64 { return oy + ph - y/maxY*ph }
		fmt.Fprintf(&b, `<g data-panel="%s">`, esc(l.name))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="label">%s<title>%s</title></text>`, ox, oy-5, esc(fitText(l.name, 12, panelW)), esc(l.name))
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
	return template.HTML(b.String())
}

func svgOpen(b *strings.Builder, title string, height int) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s">`,
		chartWidth, height, chartWidth, height, esc(title))
	fmt.Fprintf(b, `<text x="4" y="16" class="title">%s</text>`, esc(title))
}

// legend draws one swatch and name per series, on one row from (x, y),
// wrapping at the chart's edge.
func legend(b *strings.Builder, ss []series, x, y int) {
	if len(ss) < 2 {
		return
	}
	x0 := x
	for _, s := range ss {
		w := 24 + 7*len(s.name)
		if x+w > chartWidth && x > x0 {
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
