package loadtest

import (
	"fmt"
	"html/template"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// The reservations workload's table and charts, for the lab's stderr,
// results.md and report.html.

// ReservationHeads are the columns of the reservations table.
var ReservationHeads = []string{"run", "verdict", "holds 201", "confirmed", "cancelled", "abandoned", "out of stock",
	"oversold", "undersold", "lost upd", "reserved left", "double settled", "ledger mismatch", "stuck holds", "lost acks"}

// ReservationRows are the reservations runs' rows.
func ReservationRows(results []Result) [][]string {
	var rows [][]string
	for _, r := range results {
		if r.Workload != WorkloadReservations {
			continue
		}
		c := r.Checkouts
		count := func(p *int) string {
			if p == nil {
				return "-"
			}
			return strconv.Itoa(*p)
		}
		verdict := "safe"
		if !r.Safe {
			verdict = "UNSAFE"
			if r.Error != "" {
				verdict = "could not run"
			}
		}
		rows = append(rows, []string{r.Name(), verdict, strconv.Itoa(c["hold 201"]), strconv.Itoa(c["confirm 200"]),
			strconv.Itoa(c["cancel 200"]), strconv.Itoa(c["abandoned"]), strconv.Itoa(c["hold 409 out_of_stock"]),
			strconv.Itoa(r.Oversold), strconv.Itoa(r.Undersold), strconv.Itoa(r.LostUpdates), count(r.ReservedLeft), count(r.DoubleSettled),
			count(r.LedgerMismatch), count(r.StuckHolds), strconv.Itoa(r.LostAcks)})
	}
	return rows
}

// WriteReservationTable writes the reservations runs as a text table;
// nothing when there are none.
func WriteReservationTable(w io.Writer, results []Result) {
	rows := ReservationRows(results)
	if len(rows) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(ReservationHeads, "\t"))
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()
}

// reservationDefinitions says what the reservations columns mean.
const reservationDefinitions = `Reservations runs: each checkout holds 1 to 3 SKUs of the hot set (lines in random order, 1 or 2 of each, TTL 2 s), then confirms (40%), cancels (30%) or abandons the hold (30%), which the sweepers expire. The invariants are read from MySQL once the last hold has ended (its TTL, a sweep interval and a 7 s grace after it); a fault's own reservations, on a SKU of its own, are checked the same way.
*oversold* = Σ max(0, sold + reserved - stock set); *undersold* = stock left at the end of a run in which some hold was refused out_of_stock; *lost upd* = Σ |stock set - stock - reserved - sold|; *reserved left* = stock still reserved at the end; *double settled* = reservations with orders that are not confirmed, or more orders than lines, or that the stock ledger (reservation_moves) shows given back twice, or confirmed and given back; *ledger mismatch* = stock, reserved and sold that no transition of the ledger explains (a write from a stale read); *stuck holds* = holds still held, or expired later than expiry + sweep interval + grace; *lost acks* = holds answered 201, or confirms answered 200, that MySQL does not hold.`

func writeReservationsMarkdown(w io.Writer, results []Result) {
	rows := ReservationRows(results)
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## Reservations\n\n| %s |\n|%s\n", strings.Join(ReservationHeads, " | "), strings.Repeat("---|", len(ReservationHeads)))
	for _, row := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintf(w, "\n%s\n", reservationDefinitions)
}

// reservationsHTML is the reservations section of report.html: the table,
// and per run a chart of holds and settlements over time.
func reservationsHTML(results []Result) template.HTML {
	rows := ReservationRows(results)
	if len(rows) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(`<h2>Reservations</h2><div class="wide"><table class="results" data-table="reservations"><thead><tr>`)
	for _, h := range ReservationHeads {
		fmt.Fprintf(&b, "<th>%s</th>", esc(h))
	}
	b.WriteString("</tr></thead><tbody>\n")
	for _, row := range rows {
		class := "safe"
		if row[1] != "safe" {
			class = "unsafe"
		}
		fmt.Fprintf(&b, `<tr class="%s">`, class)
		for _, c := range row {
			fmt.Fprintf(&b, "<td>%s</td>", esc(c))
		}
		b.WriteString("</tr>\n")
	}
	fmt.Fprintf(&b, `</tbody></table></div><p class="defs">%s</p>`, esc(strings.ReplaceAll(reservationDefinitions, "*", "")))
	colors := map[string]string{"held": "#2563eb", "confirmed": "#16a34a", "cancelled": "#d97706", "expired": "#dc2626"}
	for _, r := range results {
		if r.Workload != WorkloadReservations || len(r.ReservationTimeline) == 0 {
			continue
		}
		ls := []line{{name: "held", color: colors["held"]}, {name: "confirmed", color: colors["confirmed"]},
			{name: "cancelled", color: colors["cancelled"]}, {name: "expired", color: colors["expired"]}}
		for _, s := range r.ReservationTimeline {
			for i, v := range []int{s.Held, s.Confirmed, s.Cancelled, s.Expired} {
				ls[i].xs, ls[i].ys = append(ls[i].xs, s.AtS), append(ls[i].ys, float64(v))
			}
		}
		b.WriteString(string(smallMultiples("reservations", r.Name()+": reservations held, confirmed, cancelled and expired over time (MySQL's clock), one panel each", "s", "per slice", ls)))
	}
	return template.HTML(b.String())
}
