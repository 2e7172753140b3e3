package loadtest

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Report is everything a lab writes to its report folder.
type Report struct {
	Results []Result
	Machine Machine
	Command string    // how the lab was invoked
	Started time.Time // when it began
	Wall    time.Duration
	// Merged names the report folders whose results this report joins
	// (lab --merge); empty for a lab that ran its runs itself.
	Merged []string
	// NotApplicable are the runs asked for whose fault or guard does not
	// apply to their backend: no runs, listed once (SplitApplicable).
	NotApplicable []Result
}

// Span says how long the runs took: the lab's wall time, or for a merged
// report where the runs came from.
func (r Report) Span() string {
	if len(r.Merged) > 0 {
		return fmt.Sprintf("%d runs merged from %s", len(r.Results), strings.Join(r.Merged, ", "))
	}
	return r.Wall.String() + " wall time"
}

// Files in the report folder.
const (
	ResultsJSON = "results.json"
	ResultsMD   = "results.md"
	ReportHTML  = "report.html"
	// TimelinesDir holds each fault run's lease timeline as an SVG file.
	TimelinesDir = "timelines"
)

// WriteReport writes results.json, results.md and report.html to dir.
func WriteReport(dir string, rep Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	rep.Wall = rep.Wall.Round(100 * time.Millisecond)
	var js, md, page bytes.Buffer
	if err := WriteJSON(&js, rep.Results); err != nil {
		return err
	}
	writeMarkdown(&md, rep)
	if err := writeHTML(&page, rep); err != nil {
		return err
	}
	files := map[string][]byte{ResultsJSON: js.Bytes(), ResultsMD: md.Bytes(), ReportHTML: page.Bytes()}
	for _, r := range rep.Results {
		if r.Timeline != nil && len(r.Timeline.Lanes) > 0 {
			files[filepath.Join(TimelinesDir, TimelineFile(r))] = []byte(timelineChart(r))
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, TimelinesDir), 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("report: %w", err)
		}
	}
	return nil
}

// WriteJSON writes results as docs/design.md's list of runs, indented. An empty
// list is [], never null.
func WriteJSON(w io.Writer, results []Result) error {
	if results == nil {
		results = []Result{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(results); err != nil {
		return fmt.Errorf("results json: %w", err)
	}
	return nil
}

// ReadJSON reads what WriteJSON wrote.
func ReadJSON(r io.Reader) ([]Result, error) {
	var results []Result
	if err := json.NewDecoder(r).Decode(&results); err != nil {
		return nil, fmt.Errorf("results json: %w", err)
	}
	return results, nil
}

func writeMarkdown(w io.Writer, rep Report) {
	fmt.Fprintf(w, "# oversold lab results\n\n")
	fmt.Fprintf(w, "`%s`, %s, %s.\n\n", rep.Command, rep.Started.Format("2006-01-02 15:04 MST"), rep.Span())
	fmt.Fprintf(w, "Machine: %s.\n\n", rep.Machine)
	writeMarkdownTable(w, rep.Results)
	fmt.Fprintf(w, "\n%s\n", definitions)
	if na := NotApplicableLines(rep.NotApplicable); len(na) > 0 {
		fmt.Fprintf(w, "\nNot run, because they do not apply: %s.\n", strings.Join(na, "; "))
	}
	writeFaultsMarkdown(w, rep.Results)
	writeClaimsMarkdown(w, rep.Results)
	writeReservationsMarkdown(w, rep.Results)
	for _, r := range rep.Results {
		if r.Error == "" && len(r.Notes) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n**%s**\n\n", r.Name())
		if r.Error != "" {
			fmt.Fprintf(w, "- could not run: %s\n", r.Error)
		}
		for _, n := range r.Notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
	}
}

// definitions says what every column means; results.md and report.html
// carry it.
const definitions = `How to read it: each run is fresh orderd replicas behind a round-robin balancer, with its own SKU(s) reset through the admin API, then a fixed number of orders of quantity 1 at a fixed rate, more than the stock.
*answers* counts HTTP statuses (none = no answer). *sold* is the ordered quantity MySQL holds; *final* the stock it holds.
*verdict*: safe when every invariant held in the run (for guard none, that says the lock held this time, not that it always will). *oversold* = max(0, sold - stock); *undersold* = stock left on a SKU that refused an order out_of_stock: customers turned away while there was stock to sell (in a gated run, "21 → 0": what the gate still withheld once its back-check had given back the pre-deductions of orders that never committed); *lost upd* = |stock - final - sold|, a decrement lost to a concurrent write; *lost acks* = orders answered 201 that MySQL does not hold; *dup* = Idempotency-Keys with more than one order.
*req/s* = requests answered (any status) per second, from the first request sent to the last answer: it cannot exceed the offered rate, and is below it when the service fell behind. Latencies are client-side over every answered request (nearest rank). *lock wait* comes from the replicas' own histograms, merged: the mean is exact, the p99 interpolated within buckets that grow about 2x each. *conflicts* are writes the guard refused. *linearizable* is Porcupine's check of the load's history (every order's send and answer times and result, and the final stock, per SKU against a stock counter): yes, no, or unknown when the check ran out of its time (loadtest.HistoryTimeout).`

//go:embed report.html.tmpl
var reportTemplate string

var reportPage = template.Must(template.New("report").Funcs(template.FuncMap{"hasPrefix": strings.HasPrefix}).Parse(reportTemplate))

func writeHTML(w io.Writer, rep Report) error {
	runs := bars{labels: make([]string, len(rep.Results)), safe: make([]bool, len(rep.Results))}
	oversold := series{name: "oversold"}
	lost := series{name: "lost updates"}
	rps := series{name: "requests answered/s"}
	p50 := series{name: "p50"}
	p99 := series{name: "p99"}
	var lines []line
	// The lesson's chart leaves out the ceiling: it has no stock to oversell.
	var lesson bars
	for i, r := range rep.Results {
		runs.labels[i], runs.safe[i] = r.Name(), r.Safe
		if !r.IsCeiling() {
			lesson.labels, lesson.safe = append(lesson.labels, r.Name()), append(lesson.safe, r.Safe)
			oversold.values = append(oversold.values, float64(r.Oversold))
			lost.values = append(lost.values, float64(r.LostUpdates))
		}
		rps.values = append(rps.values, r.ThroughputRPS)
		p50.values = append(p50.values, r.LatencyMS.P50)
		p99.values = append(p99.values, r.LatencyMS.P99)
		l := line{name: r.Name(), color: verdictColors[r.Safe][0], verdict: verdictWord(r.Safe)}
		for _, s := range r.OverTime {
			l.xs, l.ys = append(l.xs, s.At), append(l.ys, s.P99)
		}
		if len(l.xs) > 0 {
			lines = append(lines, l)
		}
	}
	lesson.id, lesson.safeKey = "invariants", "kept every invariant (0)"
	speed, latency := runs, runs
	speed.id, latency.id = "throughput", "latency"
	heads := make([]string, len(columns))
	for i, c := range columns {
		heads[i] = c.head
	}
	rows := make([][]template.HTML, len(rep.Results))
	for i, r := range rep.Results {
		for j, c := range cells(r) {
			if j == 0 {
				rows[i] = append(rows[i], runName(c))
			} else {
				rows[i] = append(rows[i], template.HTML(esc(c)))
			}
		}
	}
	var charts []template.HTML
	if len(rep.Results) > 0 {
		charts = []template.HTML{
			barChart("Requests answered per second (at most the offered rate)", "per second", speed, []series{rps}),
			barChart("Client latency per run, p50 and p99", "ms", latency, []series{p50, p99}),
		}
	}
	if len(lines) > 0 {
		charts = append(charts, smallMultiples("latency-over-time", "p99 latency over time, by when requests were sent, one panel per run", "s", "p99 ms", lines))
	}
	charts = append(charts, queueCharts(rep.Results)...)
	var lessonChart template.HTML
	if len(lesson.labels) > 0 {
		lessonChart = barChart("Oversold and lost updates per run (should be 0)", "units", lesson, []series{oversold, lost})
	}
	return reportPage.Execute(w, map[string]any{
		"Report":        rep,
		"RunNames":      runNames,
		"Lesson":        lessonChart,
		"Definitions":   strings.ReplaceAll(definitions, "*", ""),
		"RunNotes":      RunNotes(rep.Results),
		"Charts":        charts,
		"Heads":         heads,
		"Rows":          rows,
		"FaultHeads":    FaultHeads,
		"FaultRows":     FaultRows(rep.Results),
		"FaultDefs":     strings.ReplaceAll(faultDefinitions, "*", ""),
		"Summary":       Summary(rep.Results),
		"Timelines":     timelines(rep.Results),
		"NotApplicable": NotApplicableLines(rep.NotApplicable),
		"Reservations":  reservationsHTML(rep.Results),
		"ClaimHeads":    ClaimHeads,
		"Claims":        ClaimRows(rep.Results),
		"ClaimsSource":  claimsSource,
	})
}

// runName lets a long run name break after its lock, before its fault and
// at its hyphens, nowhere else.
func runName(name string) template.HTML {
	return template.HTML(strings.NewReplacer("/", "/<wbr>", "+", "<wbr>+").Replace(esc(name)))
}

// faultView is one fault run's section: its timeline and its story.
type faultView struct {
	Name     string
	Seed     int64
	Safe     bool
	Timeline template.HTML
	Story    []StoryLine
}

func timelines(results []Result) []faultView {
	var out []faultView
	for _, r := range results {
		if r.Fault == "" {
			continue
		}
		v := faultView{Name: r.Name(), Seed: r.Seed, Safe: r.Safe, Story: r.StoryLines()}
		if r.Timeline != nil && len(r.Timeline.Lanes) > 0 {
			v.Timeline = timelineChart(r)
		}
		out = append(out, v)
	}
	return out
}
