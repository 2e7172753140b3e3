package loadtest

import (
	"context"
	"fmt"
	"time"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/inventory"
)

// settleLimit bounds the wait for the gate's back-check: past its bound at
// orderd's defaults (request timeout 15 s + two write timeouts + the
// after-commit bound: 40 s) and one sweep interval, with room to spare.
const settleLimit = 50 * time.Second

// settleGate watches, after a gated run that undersold, the gate give back
// what it withheld: a replica killed between its take and its commit
// leaves the take pending, and the gate admits less than MySQL holds until
// a back-check settles it. The back-check is orderd's own (its sweeper):
// the lab starts one of its stopped replicas again for it, takes no order
// through it, and stops it after. It waits until every sold-out SKU's
// counter equals MySQL's stock, or settleLimit, and records what the gate
// still withholds then (res.UndersoldSettled).
func (rn *Runner) settleGate(ctx context.Context, run *Run, stopped *Fleet, skus []string, res *Result) error {
	if stopped != nil && len(stopped.Replicas) > 0 {
		r := stopped.Replicas[0]
		if err := r.Start(ctx); err != nil {
			return fmt.Errorf("start %s for the back-check: %w", r.Name, err)
		}
		defer func() {
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = r.Stop(stopCtx)
		}()
	}
	rdb, err := redisconn.Open(run.Servers.RedisAddr)
	if err != nil {
		return err
	}
	defer rdb.Close()
	var identity string
	if err := rn.DB.QueryRowContext(ctx, "SELECT value FROM meta WHERE name = 'database_identity'").Scan(&identity); err != nil {
		return fmt.Errorf("database identity: %w", err)
	}
	gate := inventory.NewGate(rdb, "oversold:", identity)
	t0 := time.Now()
	for {
		withheld, err := withheldBy(ctx, rn, gate, skus)
		if err != nil {
			return err
		}
		if withheld == 0 || time.Since(t0) > settleLimit {
			ms := round(float64(time.Since(t0)) / float64(time.Millisecond))
			res.UndersoldSettled, res.SettledMS = &withheld, &ms
			res.Notes = append(res.Notes, fmt.Sprintf("undersold %d at the end of the load; %d withheld by the gate %s later (its back-check gives back a take OVERSOLD_REQUEST_TIMEOUT + 25 s after it, at the next sweep)",
				res.Undersold, withheld, time.Since(t0).Round(100*time.Millisecond)))
			return nil
		}
		if err := clock.Sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// withheldBy is the stock MySQL holds on skus that their gate counters do
// not admit: takes still pending, and give-backs lost.
func withheldBy(ctx context.Context, rn *Runner, gate *inventory.Gate, skus []string) (int, error) {
	withheld := 0
	for _, sku := range skus {
		var stock int64
		if err := rn.DB.QueryRowContext(ctx, "SELECT stock FROM inventory WHERE sku = ?", sku).Scan(&stock); err != nil {
			return 0, fmt.Errorf("stock of %q: %w", sku, err)
		}
		c, ok, err := gate.Counter(ctx, sku)
		if err != nil {
			return 0, fmt.Errorf("gate counter of %q: %w", sku, err)
		}
		if ok { // unseeded: the next order seeds it from MySQL
			withheld += int(max(0, stock-c.Stock))
		}
	}
	return withheld, nil
}
