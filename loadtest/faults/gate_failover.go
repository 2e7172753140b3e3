package faults

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/loadtest"
)

// soldOutTries bounds the orders sent after the promotion: enough to show
// what a counter that forgot its deductions admits.
const soldOutTries = 8

// injectSoldOut is the Sentinel failover without a lock: what it costs the
// stock gate (or the cache alone) to lose writes. Two orders on the fault
// SKU reach the replica; replication is cut; the rest of the SKU's stock is
// sold through the master only, until the gate (or the cache) answers
// out_of_stock and MySQL holds 0. The master is killed and the replica
// promoted: its counter still holds everything sold after the cut. The
// orders sent next are admitted by that counter; guard none behind the gate
// decrements MySQL without a condition and sells stock that is gone (the
// peers' design oversells); guard atomic refuses each in MySQL, and the
// gate takes the quantity back.
func (f *failover) injectSoldOut(ctx context.Context, run *loadtest.Run, d *driver, r1, r2 *loadtest.Replica) error {
	mc := client(f.master.Addr)
	defer mc.Close()
	what := "the cache's Redis (no gate)"
	if run.Spec.Gate != "" {
		what = "the stock gate's Redis"
	}

	if ok, err := warm(ctx, run, d, r2, mc); !ok {
		return err
	}
	if _, err := f.cut(ctx, mc); err != nil {
		return err
	}
	sold, err := sellOut(ctx, run, d, r2)
	if err != nil {
		notFired(run, err)
		return nil
	}
	stock, _ := inventoryColumn(ctx, run.Servers.MySQLDSN, "stock", run.FaultSKU)
	t0 := time.Now()
	if err := f.master.Kill(); err != nil {
		return err
	}
	run.Fired("%d orders on %s reached the replica of %s; replication cut; %d more sold through the master only, until it answered out_of_stock (MySQL's stock %d); master killed (SIGKILL)",
		warmOrders, run.FaultSKU, what, sold, stock)
	if err := waitFor(ctx, 30*time.Second, "promotion", f.promoted); err != nil {
		return err
	}
	run.Eventf("sentinels promoted the replica %s after the kill: it never saw the %d orders sold after the cut", since(t0), sold)
	return afterSoldOut(ctx, run, d, r1, t0)
}

// sellOut places orders on the fault SKU through r until one is refused
// out_of_stock, and returns how many it placed.
func sellOut(ctx context.Context, run *loadtest.Run, d *driver, r *loadtest.Replica) (int, error) {
	for n := 0; n <= run.Spec.Stock; n++ {
		p := quietly(ctx, run, d, r, fmt.Sprintf("cut-%d", n+1))
		switch {
		case ordered(p):
		case p.status == http.StatusConflict && p.code == "out_of_stock":
			return n, nil
		default:
			return n, fmt.Errorf("an order after the cut was not placed (status %d %s)", p.status, p.code)
		}
	}
	return 0, fmt.Errorf("%s did not sell out after %d orders", run.FaultSKU, run.Spec.Stock+1)
}

// afterSoldOut sends the orders after the promotion, through r, and says
// what the promoted Redis admitted and MySQL did with it.
func afterSoldOut(ctx context.Context, run *loadtest.Run, d *driver, r *loadtest.Replica, t0 time.Time) error {
	admitted, refused, answered := 0, 0, 0
	for try := 1; answered < soldOutTries && try <= 4*soldOutTries; try++ {
		p := quietly(ctx, run, d, r, fmt.Sprintf("after-%d", try))
		switch {
		case ordered(p):
			admitted++
		case p.status == http.StatusConflict:
			refused++
		default: // the replica has not followed the sentinels yet
			if clock.Sleep(ctx, 200*time.Millisecond) != nil {
				return nil
			}
			continue
		}
		if answered++; answered == 1 {
			run.Recovered(time.Since(t0))
		}
	}
	stock, err := inventoryColumn(ctx, run.Servers.MySQLDSN, "stock", run.FaultSKU)
	if err != nil {
		return err
	}
	switch {
	case answered == 0:
		run.Eventf("no order on %s answered after the failover", run.FaultSKU)
	case admitted > 0:
		run.Eventf("%d of the %d orders answered after the failover placed although %s had sold out: MySQL's stock is now %d (guard %s checks nothing)", admitted, answered, run.FaultSKU, stock, run.Spec.Guard)
	default:
		run.Eventf("all %d orders after the failover were refused (409): MySQL's stock is %d; guard %s refuses what MySQL does not hold", answered, stock, run.Spec.Guard)
	}
	return nil
}
