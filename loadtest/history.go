package loadtest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/anishathalye/porcupine"
)

// The history check is a second opinion on a run, independent of the
// invariant checker (check.go): every order the load sent, with the time it
// was sent and answered, what it got and the replica that served it, and at
// the end one read of each SKU's stock from MySQL, checked for
// linearizability against a sequential stock counter per SKU with
// Porcupine (Anish Athalye's checker, the one etcd's robustness tests use).
//
// The model: an order of quantity 1 answered 201 takes one from a stock of
// at least 1; answered 409 out_of_stock, it found the stock at 0; refused
// otherwise (409 conflict or lock_lost, 4xx, 503 lock_timeout) it changed
// nothing. An order with no definite answer (no response, 503 unavailable,
// 5xx) may or may not have taken
// one, at any moment before the final read (the replicas are stopped by
// then). The read must see the counter. So an oversell (more 201s than
// stock), a lost update (the read sees more stock than the 201s left) and an
// early sellout (out_of_stock while stock remained) are all violations.

// HistoryTimeout bounds one run's check: linearizability checking is
// NP-hard, and a run that takes longer is reported "unknown".
const HistoryTimeout = 10 * time.Second

// Linearizability verdicts, as Result.Linearizable has them.
const (
	Linearizable    = "linearizable"
	NotLinearizable = "not linearizable"
	HistoryUnknown  = "unknown" // the check timed out
)

type stockIn struct {
	sku  string
	read bool
}

type stockOut struct {
	code    int    // HTTP status of an order (0: none)
	error   string // its error code
	refused bool   // it wrote nothing (see refused)
	stock   int    // what a read saw
}

// stockModel is a stock counter per SKU (Init is the initial stock of
// every SKU of the run).
func stockModel(initial int) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			var order []string
			for _, op := range h {
				sku := op.Input.(stockIn).sku
				if _, ok := by[sku]; !ok {
					order = append(order, sku)
				}
				by[sku] = append(by[sku], op)
			}
			out := make([][]porcupine.Operation, len(order))
			for i, sku := range order {
				out[i] = by[sku]
			}
			return out
		},
		Init: func() []any { return []any{initial} },
		Step: func(state, input, output any) []any {
			s, in, out := state.(int), input.(stockIn), output.(stockOut)
			if in.read {
				if out.stock == s {
					return []any{s}
				}
				return nil
			}
			switch {
			case out.code == http.StatusCreated || out.code == http.StatusOK:
				if s >= 1 {
					return []any{s - 1}
				}
				return nil
			case out.code == http.StatusConflict && out.error == "out_of_stock":
				if s < 1 {
					return []any{s}
				}
				return nil
			case out.refused:
				return []any{s} // nothing written
			default: // no definite answer: either
				if s >= 1 {
					return []any{s, s - 1}
				}
				return []any{s}
			}
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(stockIn), output.(stockOut)
			if in.read {
				return fmt.Sprintf("read %s = %d", in.sku, out.stock)
			}
			return fmt.Sprintf("order %s -> %d %s", in.sku, out.code, out.error)
		},
	}
	return nm.ToModel()
}

// CheckHistory checks the load's answers and each SKU's final stock for
// linearizability, for at most timeout. readAt is when the stock was read
// (after every order ended).
// why says what makes it not linearizable, when a count or the order of
// answers shows it; Porcupine's search does not say.
func CheckHistory(answers []Answer, initial int, final map[string]int, readAt time.Time, timeout time.Duration) (verdict, why string) {
	if why, ok := countVerdict(answers, initial, final); ok {
		return NotLinearizable, why
	}
	end := readAt.UnixNano()
	ops := make([]porcupine.Operation, 0, len(answers)+len(final))
	for i, a := range answers {
		if refused(a) {
			continue // changes nothing in any state: no constraint to check
		}
		ret := a.End.UnixNano()
		if !definite(a) {
			ret = end - 1 // it may have taken effect at any time until the replicas stopped
		}
		ops = append(ops, porcupine.Operation{
			ClientId: i, Input: stockIn{sku: a.SKU}, Output: stockOut{code: a.Code, error: a.Error, refused: refused(a)},
			Call: a.Sent.UnixNano(), Return: max(ret, a.Sent.UnixNano()),
		})
	}
	for sku, stock := range final {
		ops = append(ops, porcupine.Operation{
			ClientId: len(ops), Input: stockIn{sku: sku, read: true}, Output: stockOut{stock: stock},
			Call: end, Return: end,
		})
	}
	switch porcupine.CheckOperationsTimeout(stockModel(initial), ops, timeout) {
	case porcupine.Ok:
		return Linearizable, ""
	case porcupine.Illegal:
		return NotLinearizable, "no order of the operations fits the stock counter (Porcupine's search)"
	}
	return HistoryUnknown, ""
}

// countVerdict settles without a search a history that no order of its
// operations can explain, and says why: more sales than stock, a final
// stock that the sales and the undecided orders cannot account for, or an
// out_of_stock answered before a sale was even sent (the stock never grows
// back, so no order puts that sale before the sellout).
func countVerdict(answers []Answer, initial int, final map[string]int) (string, bool) {
	sold, undecided := map[string]int{}, map[string]int{}
	firstOut, lastSale := map[string]Answer{}, map[string]Answer{}
	for _, a := range answers {
		switch {
		case a.Code == http.StatusCreated || a.Code == http.StatusOK:
			sold[a.SKU]++
			if l, ok := lastSale[a.SKU]; !ok || a.Sent.After(l.Sent) {
				lastSale[a.SKU] = a
			}
		case a.Code == http.StatusConflict && a.Error == "out_of_stock":
			if f, ok := firstOut[a.SKU]; !ok || a.End.Before(f.End) {
				firstOut[a.SKU] = a
			}
		case !definite(a):
			undecided[a.SKU]++
		}
	}
	for sku, stock := range final {
		switch left := initial - sold[sku]; {
		case sold[sku] > initial:
			return fmt.Sprintf("%s: %d sales of a stock of %d", sku, sold[sku], initial), true
		case stock > left || stock < left-undecided[sku]:
			return fmt.Sprintf("%s: final stock %d, but %d sales of %d leave %d (%d orders undecided)", sku, stock, sold[sku], initial, left, undecided[sku]), true
		}
		f, l := firstOut[sku], lastSale[sku]
		if !f.End.IsZero() && !l.Sent.IsZero() && f.End.Before(l.Sent) {
			return fmt.Sprintf("%s: out_of_stock answered by %s %s before a sale was sent to %s", sku, f.Replica, l.Sent.Sub(f.End).Round(time.Microsecond), l.Replica), true
		}
	}
	return "", false
}

// refused: a 4xx other than out_of_stock, or a 503 lock_timeout (the lock
// was never granted): nothing written.
func refused(a Answer) bool {
	if a.Code == http.StatusServiceUnavailable {
		return a.Error == "lock_timeout"
	}
	return a.Code >= 400 && a.Code < 500 && !(a.Code == http.StatusConflict && a.Error == "out_of_stock")
}

// definite: the order's answer says what it did.
func definite(a Answer) bool {
	return a.Code == http.StatusCreated || a.Code == http.StatusOK || refused(a) || (a.Code == http.StatusConflict && a.Error == "out_of_stock")
}

// finalStock reads each SKU's stock from MySQL.
func finalStock(ctx context.Context, db *sql.DB, skus []string) (map[string]int, error) {
	out := make(map[string]int, len(skus))
	for _, sku := range skus {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT stock FROM inventory WHERE sku = ?", sku).Scan(&n); err != nil {
			return nil, fmt.Errorf("final stock of %s: %w", sku, err)
		}
		out[sku] = n
	}
	return out, nil
}

// errorCode is the "code" of an API error body, or "".
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	return e.Error.Code
}

// checkHistory is the run's history check, with what it says in res.
func checkHistory(ctx context.Context, db *sql.DB, spec Spec, skus []string, answers []Answer, res *Result) {
	readAt := time.Now()
	final, err := finalStock(ctx, db, skus)
	if err != nil {
		res.Notes = append(res.Notes, "history check: "+err.Error())
		return
	}
	t0 := time.Now()
	var why string
	res.Linearizable, why = CheckHistory(answers, spec.Stock, final, readAt, HistoryTimeout)
	if why != "" {
		res.Notes = append(res.Notes, "not linearizable: "+why)
	}
	res.HistoryOps = len(answers) + len(final)
	res.HistoryCheckMS = round(float64(time.Since(t0)) / float64(time.Millisecond))
}

// compareHistory notes where the invariant checker and Porcupine disagree.
// They look at different things: the checker at the load's SKUs and the
// fault's own, Porcupine at the load's orders only, and at their order in
// time (an out_of_stock answered while stock remained breaks no invariant).
func (r *Result) compareHistory() {
	loadSafe := r.Error == "" && !r.NotApplicable && r.Oversold == 0 && r.LostUpdates == 0
	switch {
	case r.Linearizable == NotLinearizable && loadSafe:
		r.Notes = append(r.Notes, "Porcupine finds the history not linearizable while every invariant held")
	case r.Linearizable == Linearizable && !r.Safe && r.Error == "":
		r.Notes = append(r.Notes, "Porcupine finds the load's history linearizable while an invariant broke (the fault's own orders, or what the load did not see)")
	}
}
