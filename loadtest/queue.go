package loadtest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Accept queue runs (docs/design.md "Accepting an order (OVERSOLD_ACCEPT)"):
// a 202 says the order is queued, not written. Before the replicas stop,
// the lab waits for every accepted order to reach its final status in
// MySQL, up to queueDrainBound, and counts what became of them.

// queuedTable holds the outcome of every queued order (package storage).
const queuedTable = "queued_orders"

// queueDrainBound is how long the lab waits, after the load, for the
// replicas to write what they accepted: far above what a run's backlog
// takes, and longer than the replicas' claim bound (35 s by default), so
// an order a dead consumer held is counted once another replica claimed it.
const queueDrainBound = 90 * time.Second

// Accepted is an order answered 202, and when the answer came.
type Accepted struct {
	ID string
	At time.Time
}

// queueOutcome is a queued order's final status in MySQL.
type queueOutcome struct {
	status  string // confirmed or rejected
	settled time.Time
}

// drainQueue waits for the accepted orders' outcomes and records them in
// res. An order MySQL holds no outcome for after the bound is asked of the
// replicas: pending there, it is left pending; unknown (404), it was lost
// with the queue.
func drainQueue(ctx context.Context, db *sql.DB, urls []string, accepted []Accepted, bound time.Duration, res *Result) (map[string]queueOutcome, error) {
	outcomes := map[string]queueOutcome{}
	deadline := time.Now().Add(bound)
	for {
		var left []string
		for _, a := range accepted {
			if _, ok := outcomes[a.ID]; !ok {
				left = append(left, a.ID)
			}
		}
		if err := readOutcomes(ctx, db, left, outcomes); err != nil {
			return nil, fmt.Errorf("queue drain: %w", err)
		}
		if len(outcomes) == len(accepted) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	var rejected, lost, pending int
	var settledSince []string
	for i, a := range accepted {
		if _, ok := outcomes[a.ID]; ok {
			continue
		}
		switch queuedStatus(ctx, urls[i%len(urls)], a.ID) {
		case http.StatusNotFound:
			lost++
		case http.StatusOK: // pending: counted below
		default: // settled since the last read, or the replica could not tell
			settledSince = append(settledSince, a.ID)
		}
	}
	if err := readOutcomes(ctx, db, settledSince, outcomes); err != nil {
		return nil, fmt.Errorf("queue drain: %w", err)
	}
	var waits []time.Duration
	for _, a := range accepted {
		o, ok := outcomes[a.ID]
		if !ok {
			continue
		}
		waits = append(waits, max(o.settled.Sub(a.At), 0))
		if o.status == "rejected" {
			rejected++
		}
	}
	// The rest: shown pending, or not known lost (no replica said 404).
	pending = len(accepted) - len(waits) - lost
	n := len(accepted)
	res.Accepted, res.RejectedAfterAccept, res.LostAccepted, res.PendingLeft = &n, &rejected, &lost, &pending
	if len(waits) > 0 {
		var sum time.Duration
		for _, w := range waits {
			sum += w
		}
		res.ConfirmMS = &Wait{Count: int64(len(waits)), Mean: ms(sum / time.Duration(len(waits))),
			P50: ms(percentile(waits, 0.50)), P99: ms(percentile(waits, 0.99))}
	}
	if lost > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d accepted orders lost: neither in MySQL nor pending", lost))
	}
	if pending > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d accepted orders still pending %v after the load", pending, bound))
	}
	return outcomes, nil
}

// drainFaultQueue drains the fault's own 202s (Run.AcceptedQueued), on its
// SKU, and adds only what went wrong with them to res, as addFaultSKU does:
// the run's accepted and confirm figures stay the load's.
func (res *Result) drainFaultQueue(ctx context.Context, db *sql.DB, urls []string, accepted []Accepted) error {
	if len(accepted) == 0 {
		return nil
	}
	var own Result
	if _, err := drainQueue(ctx, db, urls, accepted, queueDrainBound, &own); err != nil {
		return err
	}
	*res.LostAccepted += *own.LostAccepted
	*res.PendingLeft += *own.PendingLeft
	for _, n := range own.Notes {
		res.Notes = append(res.Notes, "the fault's own orders: "+n)
	}
	return nil
}

// readOutcomes adds the outcomes MySQL holds for ids to out. settled_at is
// read as microseconds since the epoch of its UTC value, whatever the
// session's time zone.
func readOutcomes(ctx context.Context, db *sql.DB, ids []string, out map[string]queueOutcome) error {
	const batch = 500
	for start := 0; start < len(ids); start += batch {
		in, args := placeholders(ids[start:min(start+batch, len(ids))])
		err := eachRow(ctx, db, func(rows *sql.Rows) error {
			var id, status string
			var us int64
			if err := rows.Scan(&id, &status, &us); err != nil {
				return err
			}
			out[id] = queueOutcome{status: status, settled: time.UnixMicro(us)}
			return nil
		}, "SELECT CAST(id AS CHAR), status, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', settled_at) FROM "+queuedTable+" WHERE id IN "+in, args...)
		if err != nil {
			return err
		}
	}
	return nil
}

// queuedStatus is what a replica answers for the order id: 200 when it
// shows it pending, 404 for an order it does not know; 0 otherwise (settled
// since, or no answer).
func queuedStatus(ctx context.Context, base, id string) int {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/orders/"+id, nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var o struct{ Status string }
	if resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&o) == nil && o.Status != "pending" {
		return 0 // settled since the read: not pending, not lost
	}
	return resp.StatusCode
}
