package loadtest

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// column is one column of the results table, shared by the terminal table
// and results.md so the two never disagree.
type column struct {
	head string
	cell func(Result) string
}

var columns = []column{
	{"run", Result.Name},
	{"verdict", Result.Verdict},
	{"answers", func(r Result) string { return statusLine(r) }},
	{"sold/stock", func(r Result) string { return fmt.Sprintf("%d/%d", r.OrderedQuantity, r.InitialStock) }},
	{"final", func(r Result) string { return strconv.Itoa(r.FinalStock) }},
	{"oversold", func(r Result) string { return strconv.Itoa(r.Oversold) }},
	{"undersold", func(r Result) string { return undersoldCell(r.Undersold, r.UndersoldSettled) }},
	{"lost upd", func(r Result) string { return strconv.Itoa(r.LostUpdates) }},
	{"lost acks", func(r Result) string { return strconv.Itoa(r.LostAcks) }},
	{"dup", func(r Result) string { return strconv.Itoa(r.Duplicates) }},
	{"req/s", func(r Result) string { return fmt.Sprintf("%.0f", r.ThroughputRPS) }},
	{"p50 ms", func(r Result) string { return fmt.Sprintf("%.1f", r.LatencyMS.P50) }},
	{"p99 ms", func(r Result) string { return fmt.Sprintf("%.1f", r.LatencyMS.P99) }},
	{"lock wait mean/p99", func(r Result) string {
		if r.LockWaitMS == nil {
			return "-"
		}
		return fmt.Sprintf("%s/%s", num(r.LockWaitMS.Mean), num(r.LockWaitMS.P99))
	}},
	{"conflicts", func(r Result) string { return strconv.Itoa(r.Conflicts) }},
	{"linearizable", func(r Result) string { return cmp.Or(linearizableCell[r.Linearizable], "-") }},
}

// linearizableCell is Porcupine's verdict (Result.Linearizable) in a cell.
var linearizableCell = map[string]string{Linearizable: "yes", NotLinearizable: "no", HistoryUnknown: "unknown"}

// statusLine is the answers by status, e.g. "201×100 409×500".
func statusLine(r Result) string {
	codes := make([]string, 0, len(r.Status))
	for c := range r.Status {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	parts := make([]string, 0, len(codes)+1)
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%s×%d", c, r.Status[c]))
	}
	if r.NoResponse > 0 {
		parts = append(parts, fmt.Sprintf("none×%d", r.NoResponse))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// WriteTable writes the results as an aligned text table, one row per run.
func WriteTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	heads := make([]string, len(columns))
	for i, c := range columns {
		heads[i] = c.head
	}
	fmt.Fprintln(tw, strings.Join(heads, "\t"))
	for _, r := range results {
		fmt.Fprintln(tw, strings.Join(cells(r), "\t"))
	}
	return tw.Flush()
}

// writeMarkdownTable writes the same table in Markdown.
func writeMarkdownTable(w io.Writer, results []Result) {
	heads := make([]string, len(columns))
	rule := make([]string, len(columns))
	for i, c := range columns {
		heads[i], rule[i] = c.head, "---"
	}
	fmt.Fprintf(w, "| %s |\n|%s|\n", strings.Join(heads, " | "), strings.Join(rule, "|"))
	for _, r := range results {
		row := cells(r)
		for i, c := range row {
			row[i] = strings.NewReplacer("|", `\|`, "\n", " ").Replace(c)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
}

// ceilingColumns are the columns a ceiling run measures: it has no stock,
// no lock and no invariants.
var ceilingColumns = []string{"run", "verdict", "answers", "req/s", "p50 ms", "p99 ms"}

// cells is r's row. A run that could not be made has only its name and
// its verdict (the first two): zeros would read as measurements.
func cells(r Result) []string {
	out := make([]string, len(columns))
	for i, c := range columns {
		switch {
		case r.IsCeiling() && !slices.Contains(ceilingColumns, c.head):
			out[i] = "-"
		case r.Error == "" || i <= 1:
			out[i] = c.cell(r)
		default:
			out[i] = "-"
		}
	}
	return out
}
