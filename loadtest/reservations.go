package loadtest

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The reservations workload (docs/design.md, "The lab"): each checkout
// holds 1 to 3 SKUs of the run's hot set, its lines in random order, then
// confirms, cancels or abandons the hold, which expires. Short TTLs make
// the sweepers expire holds inside the run. The invariants are read from
// MySQL once the last hold has ended: its expiry, plus a sweep interval,
// plus a grace.

// WorkloadReservations is Spec.Workload and Result.Workload for checkouts.
const WorkloadReservations = "reservations"

const (
	reservationsTable = "reservations"
	movesTable        = "reservation_moves"
	// checkoutTTL is each hold's ttl_seconds, and checkoutSweep the
	// replicas' OVERSOLD_SWEEP_INTERVAL in a reservations run.
	checkoutTTL   = 2 * time.Second
	checkoutSweep = 500 * time.Millisecond
	// settleGrace is how long past expiry + sweep interval a hold may stay
	// held before it counts as stuck: orderd's default lock wait (an
	// expiry waits for its SKUs' locks behind the holds queued there) and
	// two seconds more.
	settleGrace = 7 * time.Second
)

// CheckoutSpec is one reservations load.
type CheckoutSpec struct {
	Target    string
	SKUs      []string
	Checkouts int // holds attempted
	Workers   int // checkouts in flight at most
	KeyPrefix string
	Seed      int64
	Progress  func(done int) // if not nil, hears the checkouts done so far
}

// CheckoutResult is what the clients saw.
type CheckoutResult struct {
	Status     map[string]int // HTTP status -> answers, every request
	Outcomes   map[string]int // "hold 201", "confirm 200", "cancel 409 reservation_expired", ...
	Held       []string       // reservations acknowledged with 201
	Confirmed  []string       // reservations acknowledged confirmed (200)
	Requests   int
	NoResponse int
	FirstError string
	Duration   time.Duration
	Latency    Latency
	LastHold   time.Time // the last 201's answer: every hold ends by it + TTL
}

// Checkouts runs spec's checkouts against the balancer.
func Checkouts(ctx context.Context, spec CheckoutSpec) (*CheckoutResult, error) {
	if len(spec.SKUs) == 0 || spec.Checkouts <= 0 {
		return nil, fmt.Errorf("checkouts: no SKUs or no checkouts")
	}
	client := &http.Client{Timeout: requestTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: max(spec.Workers, 1)}}
	defer client.CloseIdleConnections()
	res := &CheckoutResult{Status: map[string]int{}, Outcomes: map[string]int{}}
	var mu sync.Mutex
	var lat []time.Duration
	record := func(op string, code int, errCode string, took time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		res.Requests++
		if err != nil {
			res.NoResponse++
			if res.FirstError == "" {
				res.FirstError = err.Error()
			}
			res.Outcomes[op+" no answer"]++
			return
		}
		lat = append(lat, took)
		res.Status[strconv.Itoa(code)]++
		key := fmt.Sprintf("%s %d", op, code)
		if errCode != "" {
			key += " " + errCode
		}
		res.Outcomes[key]++
	}
	next := make(chan int)
	go func() {
		defer close(next)
		for i := range spec.Checkouts {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	start := time.Now()
	var done atomic.Int64
	progress := func() {
		if n := done.Add(1); spec.Progress != nil {
			spec.Progress(int(n))
		}
	}
	var wg sync.WaitGroup
	for w := range max(spec.Workers, 1) {
		rng := rand.New(rand.NewPCG(uint64(spec.Seed), uint64(w)))
		wg.Go(func() {
			for i := range next {
				body := checkoutBody(rng, spec.SKUs)
				key := fmt.Sprintf("%s-c%d", spec.KeyPrefix, i)
				code, out, took, err := post(ctx, client, spec.Target+"/v1/reservations", body, key)
				record("hold", code, errorCodeOf(out), took, err)
				if err != nil || code != http.StatusCreated {
					progress()
					continue
				}
				id := idOf(out)
				mu.Lock()
				res.Held = append(res.Held, id)
				res.LastHold = time.Now()
				mu.Unlock()
				switch n := rng.IntN(10); {
				case n < 4:
					code, out, took, err := post(ctx, client, spec.Target+"/v1/reservations/"+id+"/confirm", nil, "")
					record("confirm", code, errorCodeOf(out), took, err)
					if err == nil && code == http.StatusOK {
						mu.Lock()
						res.Confirmed = append(res.Confirmed, id)
						mu.Unlock()
					}
				case n < 7:
					code, out, took, err := post(ctx, client, spec.Target+"/v1/reservations/"+id+"/cancel", nil, "")
					record("cancel", code, errorCodeOf(out), took, err)
				default:
					mu.Lock()
					res.Outcomes["abandoned"]++
					mu.Unlock()
				}
				progress()
			}
		})
	}
	wg.Wait()
	res.Duration = time.Since(start)
	res.Latency = Latency{P50: ms(percentile(lat, 0.5)), P90: ms(percentile(lat, 0.9)), P99: ms(percentile(lat, 0.99)), Max: ms(percentile(lat, 1))}
	return res, ctx.Err()
}

// checkoutBody is a hold of 1 to 3 distinct SKUs of skus, in random order,
// 1 or 2 of each, expiring in checkoutTTL.
func checkoutBody(rng *rand.Rand, skus []string) []byte {
	n := 1 + rng.IntN(min(3, len(skus)))
	type line struct {
		SKU      string `json:"sku"`
		Quantity int    `json:"quantity"`
	}
	var lines []line
	for _, i := range rng.Perm(len(skus))[:n] {
		lines = append(lines, line{skus[i], 1 + rng.IntN(2)})
	}
	b, _ := json.Marshal(map[string]any{"lines": lines, "ttl_seconds": int(checkoutTTL / time.Second)})
	return b
}

// post sends a JSON POST and returns the status and body.
func post(ctx context.Context, client *http.Client, url string, body []byte, key string) (int, []byte, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, 0, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, out, time.Since(t0), err
}

func idOf(body []byte) string {
	var v struct {
		ID string `json:"id"`
	}
	json.Unmarshal(body, &v)
	return v.ID
}

func errorCodeOf(body []byte) string {
	var v struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal(body, &v)
	return v.Error.Code
}

// ReservationInvariants is what MySQL holds after a reservations run.
type ReservationInvariants struct {
	Invariants
	// ReservedLeft is the stock still reserved once every hold has ended.
	ReservedLeft int
	// DoubleSettled counts reservations settled more than once: orders
	// of a reservation that is not confirmed (confirmed and given back),
	// more orders than lines, or in the ledger (reservation_moves) more
	// give-backs or confirms than holds, or both a give-back and a confirm.
	DoubleSettled int
	// LedgerMismatch is the stock, reserved and sold quantity of the SKUs
	// that the ledger does not explain: Σ |stock - (set + Σ stock moves)| +
	// |reserved - Σ reserved moves| + |sold - Σ confirmed|. A guarded
	// write from a stale read (guard none) changes a row by another amount
	// than its transition meant, a double give-back in effect, which the
	// sum stock + reserved + sold alone may not show.
	LedgerMismatch int
	// StuckHolds counts holds still held, or expired later than, their
	// expires_at + sweep + grace.
	StuckHolds int
	// Timeline is held, confirmed, cancelled and expired per time slice.
	Timeline []ReservationSlice
}

// ReservationSlice counts the transitions of one time slice of a run, by
// MySQL's clock, from the run's first hold.
type ReservationSlice struct {
	AtS       float64 `json:"at_s"`
	Held      int     `json:"held"`
	Confirmed int     `json:"confirmed"`
	Cancelled int     `json:"cancelled"`
	Expired   int     `json:"expired"`
}

// CheckReservations reads the run's SKUs and reservations back from MySQL.
// For every SKU: stock set = stock + reserved + sold; oversold counts sold
// + reserved beyond the stock set, lost_updates |set - stock - reserved -
// sold|. held are the reservations acknowledged 201, confirmed the ones
// acknowledged confirmed.
func CheckReservations(ctx context.Context, db *sql.DB, skus []string, initial int, held, confirmed []string, sweep time.Duration) (ReservationInvariants, error) {
	var inv ReservationInvariants
	in, args := placeholders(skus)
	type row struct{ stock, reserved, sold int }
	rows := map[string]*row{}
	if err := eachRow(ctx, db, func(r *sql.Rows) error {
		var sku string
		var x row
		if err := r.Scan(&sku, &x.stock, &x.reserved); err != nil {
			return err
		}
		rows[sku] = &x
		return nil
	}, "SELECT sku, stock, reserved FROM "+inventoryTable+" WHERE sku IN "+in, args...); err != nil {
		return inv, fmt.Errorf("check: stock: %w", err)
	}
	if err := eachRow(ctx, db, func(r *sql.Rows) error {
		var sku string
		var q int
		if err := r.Scan(&sku, &q); err != nil {
			return err
		}
		if x, ok := rows[sku]; ok {
			x.sold = q
		}
		return nil
	}, "SELECT sku, SUM(quantity) FROM "+ordersTable+" WHERE sku IN "+in+" GROUP BY sku", args...); err != nil {
		return inv, fmt.Errorf("check: sold: %w", err)
	}
	for _, sku := range skus {
		x, ok := rows[sku]
		if !ok {
			return inv, fmt.Errorf("check: SKU %q has no %s row", sku, inventoryTable)
		}
		inv.InitialStock += initial
		inv.FinalStock += x.stock
		inv.OrderedQuantity += x.sold
		inv.ReservedLeft += x.reserved
		inv.Oversold += max(0, x.sold+x.reserved-initial)
		inv.LostUpdates += abs(initial - x.stock - x.reserved - x.sold)
	}

	doubly, err := checkLedger(ctx, db, skus, initial, &inv)
	if err != nil {
		return inv, err
	}

	// The reservations acknowledged, one by one.
	all := map[string]*checkedHold{}
	grace := (sweep + settleGrace).Microseconds()
	for _, id := range held {
		var r checkedHold
		var lines string
		err := db.QueryRowContext(ctx, "SELECT status, `lines`, created_at, settled_at, "+
			"(status = 'held' AND expires_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND) OR "+
			"(status = 'expired' AND settled_at > expires_at + INTERVAL ? MICROSECOND), "+
			"(SELECT COUNT(*) FROM "+ordersTable+" o WHERE o.reservation_id = r.id) FROM "+reservationsTable+" r WHERE id = ?",
			grace, grace, id).Scan(&r.status, &lines, &r.created, &r.settled, &r.stuck, &r.orders)
		if err == sql.ErrNoRows {
			inv.LostAcks++
			if len(inv.MissingIDs) < 5 {
				inv.MissingIDs = append(inv.MissingIDs, id)
			}
			continue
		}
		if err != nil {
			return inv, fmt.Errorf("check: reservation %s: %w", id, err)
		}
		var ls []json.RawMessage
		json.Unmarshal([]byte(lines), &ls)
		r.lines = len(ls)
		all[id] = &r
		if r.stuck {
			inv.StuckHolds++
		}
		if ((r.status != "confirmed" && r.orders > 0) || r.orders > r.lines) && !doubly[id] {
			inv.DoubleSettled++
		}
	}
	for _, id := range confirmed {
		if r, ok := all[id]; ok && r.status != "confirmed" {
			inv.LostAcks++ // a confirm acknowledged that MySQL does not hold
		}
	}
	err = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM (SELECT idempotency_key FROM "+reservationsTable+
		" WHERE idempotency_key IN (SELECT idempotency_key FROM "+reservationsTable+" WHERE id IN "+placeholdersOrNull(held)+")"+
		" GROUP BY idempotency_key HAVING COUNT(*) > 1) d", anys(held)...).Scan(&inv.Duplicates)
	if err != nil {
		return inv, fmt.Errorf("check: duplicate keys: %w", err)
	}
	inv.Timeline = timeline(all)
	return inv, nil
}

// checkLedger compares the SKUs' rows with the stock ledger
// (reservation_moves) and counts the reservations it shows settled twice,
// acknowledged or not. It returns those reservations' ids.
func checkLedger(ctx context.Context, db *sql.DB, skus []string, initial int, inv *ReservationInvariants) (map[string]bool, error) {
	in, args := placeholders(skus)
	twice := map[string]bool{}
	err := eachRow(ctx, db, func(r *sql.Rows) error {
		var id string
		if err := r.Scan(&id); err != nil {
			return err
		}
		twice[id] = true
		return nil
	}, "SELECT reservation_id FROM "+movesTable+" WHERE reservation_id IN (SELECT reservation_id FROM "+movesTable+" WHERE sku IN "+in+")"+
		" GROUP BY reservation_id HAVING SUM(op IN ('cancel', 'expire')) > SUM(op = 'hold') OR SUM(op = 'confirm') > SUM(op = 'hold')"+
		" OR (SUM(op IN ('cancel', 'expire')) > 0 AND SUM(op = 'confirm') > 0)", args...)
	if err != nil {
		return nil, fmt.Errorf("check: ledger: %w", err)
	}
	inv.DoubleSettled += len(twice)
	// Every SKU's row against its ledger, from the stock set: what the
	// transitions meant to write against what the rows hold.
	err = eachRow(ctx, db, func(r *sql.Rows) error {
		var off int
		if err := r.Scan(&off); err != nil {
			return err
		}
		inv.LedgerMismatch += off
		return nil
	}, "SELECT ABS(i.stock - ? - COALESCE(m.stock, 0)) + ABS(i.reserved - COALESCE(m.reserved, 0)) + ABS(COALESCE(o.sold, 0) - COALESCE(m.sold, 0))"+
		" FROM "+inventoryTable+" i"+
		" LEFT JOIN (SELECT sku, SUM(stock) stock, SUM(reserved) reserved, SUM(IF(op = 'confirm', -reserved, 0)) sold FROM "+movesTable+" WHERE sku IN "+in+" GROUP BY sku) m ON m.sku = i.sku"+
		" LEFT JOIN (SELECT sku, SUM(quantity) sold FROM "+ordersTable+" WHERE sku IN "+in+" GROUP BY sku) o ON o.sku = i.sku"+
		" WHERE i.sku IN "+in, append(append(append([]any{initial}, args...), args...), args...)...)
	if err != nil {
		return nil, fmt.Errorf("check: ledger against the rows: %w", err)
	}
	return twice, nil
}

// checkedHold is one acknowledged hold as MySQL holds it.
type checkedHold struct {
	status  string
	lines   int
	orders  int
	stuck   bool
	created time.Time
	settled sql.NullTime
}

// timeline cuts the run into about overTimeSlices slices and counts holds
// by their created_at and settlements by their settled_at (MySQL's clock).
func timeline(all map[string]*checkedHold) []ReservationSlice {
	if len(all) == 0 {
		return nil
	}
	var first, last time.Time
	for _, r := range all {
		for _, t := range []time.Time{r.created, r.settled.Time} {
			if t.IsZero() {
				continue
			}
			if first.IsZero() || t.Before(first) {
				first = t
			}
			if t.After(last) {
				last = t
			}
		}
	}
	width := max(last.Sub(first)/overTimeSlices, 100*time.Millisecond)
	out := make([]ReservationSlice, int(last.Sub(first)/width)+1)
	for i := range out {
		out[i].AtS = round((time.Duration(i) * width).Seconds())
	}
	for _, r := range all {
		out[int(r.created.Sub(first)/width)].Held++
		if !r.settled.Valid {
			continue
		}
		s := &out[int(r.settled.Time.Sub(first)/width)]
		switch r.status {
		case "confirmed":
			s.Confirmed++
		case "cancelled":
			s.Cancelled++
		case "expired":
			s.Expired++
		}
	}
	return out
}

func placeholdersOrNull(ids []string) string {
	if len(ids) == 0 {
		return "(NULL)"
	}
	in, _ := placeholders(ids)
	return in
}

func anys(ids []string) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// zero reports a count that is absent or 0.
func zero(n *int) bool { return n == nil || *n == 0 }

// checkoutLoad is Runner.load for the reservations workload: spec.Requests
// checkouts, and the fault alongside them (it may outlast them: it drives
// its own reservations), then a wait until every hold has ended (its TTL,
// a sweep interval and a grace after the last one, or after the fault's
// end) while the replicas still run.
func (rn *Runner) checkoutLoad(ctx context.Context, run *Run, fault Fault, spec AttackSpec, res *Result) (*AttackResult, error) {
	t0 := time.Now()
	limit := loadLimit(spec)
	loadCtx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	faultCtx, endFault := context.WithCancel(loadCtx)
	defer endFault()
	faultDone := make(chan error, 1)
	if fault.Inject != nil {
		go func() { faultDone <- fault.Inject(faultCtx, run) }()
	} else {
		faultDone <- nil
	}
	co, err := Checkouts(loadCtx, CheckoutSpec{
		Target: spec.Target, SKUs: spec.SKUs, Checkouts: spec.Requests, Workers: spec.Workers,
		KeyPrefix: spec.KeyPrefix, Seed: run.Spec.Seed, Progress: spec.Progress,
	})
	endFault()
	if ferr := <-faultDone; ferr != nil {
		res.Notes = append(res.Notes, "fault "+run.Spec.Fault+": "+ferr.Error())
	}
	if co == nil {
		return nil, err
	}
	if err != nil && ctx.Err() == nil {
		res.Notes = append(res.Notes, fmt.Sprintf("load cut off after %s: %v", limit, err))
	}
	run.checkouts = co
	res.Status, res.NoResponse = co.Status, co.NoResponse
	res.Checkouts = co.Outcomes
	res.DurationS = round(co.Duration.Seconds())
	if co.Duration > 0 {
		res.ThroughputRPS = round(float64(co.Requests) / co.Duration.Seconds())
		res.OrdersRPS = round(float64(len(co.Confirmed)) / co.Duration.Seconds())
	}
	res.LatencyMS = co.Latency
	if co.FirstError != "" {
		res.Notes = append(res.Notes, fmt.Sprintf("%d requests got no answer, the first: %s", co.NoResponse, co.FirstError))
	}
	last := co.LastHold
	skus := slices.Clone(run.SKUs)
	if fault.Inject != nil {
		last = time.Now() // the fault settles its own holds before it returns, or they expire within the grace
		skus = append(skus, run.FaultSKU)
	}
	if !last.IsZero() {
		if err := rn.awaitHoldsEnded(ctx, skus, last.Add(checkoutTTL+checkoutSweep+settleGrace)); err != nil {
			return nil, err
		}
	}
	res.Phases.Load = since(t0)
	return &AttackResult{Status: co.Status}, nil
}

// awaitHoldsEnded waits until no reservation on skus is held any more, or
// until deadline: a hold still held then is stuck, and the check says so.
func (rn *Runner) awaitHoldsEnded(ctx context.Context, skus []string, deadline time.Time) error {
	in, args := placeholders(skus)
	for time.Now().Before(deadline) {
		var n int
		err := rn.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+reservationsTable+" WHERE status = 'held' AND id IN "+
			"(SELECT reservation_id FROM "+movesTable+" WHERE sku IN "+in+")", args...).Scan(&n)
		if err == nil && n == 0 {
			return nil
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// checkCheckouts fills res from MySQL after a reservations run.
func (rn *Runner) checkCheckouts(ctx context.Context, run *Run, res *Result) error {
	co := run.checkouts
	inv, err := CheckReservations(ctx, rn.DB, run.SKUs, run.Spec.Stock, co.Held, co.Confirmed, checkoutSweep)
	if err != nil {
		return err
	}
	res.InitialStock, res.FinalStock, res.OrderedQuantity = inv.InitialStock, inv.FinalStock, inv.OrderedQuantity
	res.Oversold, res.LostUpdates, res.LostAcks, res.Duplicates = inv.Oversold, inv.LostUpdates, inv.LostAcks, inv.Duplicates
	res.ReservationTimeline = inv.Timeline
	if co.Outcomes["hold 409 out_of_stock"] > 0 {
		// A hold refused out_of_stock while stock remained available: the
		// run-wide figure, as a hold spans several SKUs.
		res.Undersold = max(0, inv.FinalStock)
	}
	if len(inv.MissingIDs) > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("acknowledged but not in MySQL: %q", inv.MissingIDs))
	}
	if run.FaultSKU != "" {
		run.mu.Lock()
		held, confirmed := slices.Clone(run.faultHeld), slices.Clone(run.faultConfirmed)
		run.mu.Unlock()
		own, err := CheckReservations(ctx, rn.DB, []string{run.FaultSKU}, run.Spec.Stock, held, confirmed, checkoutSweep)
		if err != nil {
			return err
		}
		res.addFaultSKU(own.Invariants)
		inv.ReservedLeft += own.ReservedLeft
		inv.DoubleSettled += own.DoubleSettled
		inv.StuckHolds += own.StuckHolds
		inv.LedgerMismatch += own.LedgerMismatch
	}
	res.ReservedLeft, res.DoubleSettled, res.StuckHolds = &inv.ReservedLeft, &inv.DoubleSettled, &inv.StuckHolds
	res.LedgerMismatch = &inv.LedgerMismatch
	return nil
}
