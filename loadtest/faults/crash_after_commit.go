package faults

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/loadtest"
)

// CrashAfterCommit kills a replica after its orders committed and before
// it answered, then retries each Idempotency-Key on another replica, as a
// client whose connection died would. The fault drives those orders
// itself, alongside the load, on the run's fault SKU (the load may have
// sold the others out): a batch of them (enterBatch) goes straight to the
// seeded victim, which is killed (SIGKILL) at the hook after COMMIT (and
// after the cache update, before the release and the reply). Each retry
// of a committed key must answer 200 with the order MySQL holds for it,
// one order per key, one decrement: the dedupe lives in the order
// transaction (a UNIQUE key), not beside it. The victim is started again
// afterwards.
func CrashAfterCommit() loadtest.Fault {
	return drivenFault(func(ctx context.Context, run *loadtest.Run, d *driver, r, other *loadtest.Replica) error {
		victim, first, batch := d.enterBatch(ctx, r, atAfterCommit, "crash")
		if victim == nil {
			return nil
		}
		t0 := time.Now()
		err := r.Kill()
		victim.Answer()
		if err != nil {
			return fmt.Errorf("kill %s: %w", r.Name, err)
		}
		run.Fired("%s killed (SIGKILL) after committing the batch of order key %s, before answering", victim, first.Key)
		if p := d.wait(ctx, first, lockWait); p.status != 0 {
			run.Violatedf("the killed replica answered %d", p.status)
		}
		// The client retries each key of the batch on the next replica.
		// A key MySQL holds (the struck batch's) must get that order
		// back (200); one that never reached it (queued behind the
		// batch, or too late for it) a new one; either way one order.
		for _, s := range batch {
			if err := retryAfterCrash(ctx, d, run, other, s.Key, s == first); err != nil {
				return err
			}
		}
		if err := r.Start(ctx); err != nil && ctx.Err() == nil {
			return fmt.Errorf("restart %s: %w", r.Name, err)
		}
		run.Eventf("%s started again %s after the kill", r.Name, since(t0))
		return nil
	})
}

// retryAfterCrash retries key on replica other, as a client whose
// connection died would, and checks that MySQL then holds one order for
// it, the committed one when there was one (as there must be for the key
// whose batch was struck after its commit: struck).
func retryAfterCrash(ctx context.Context, d *driver, run *loadtest.Run, other *loadtest.Replica, key string, struck bool) error {
	before, err := ordersWithKey(ctx, run.Servers.MySQLDSN, key)
	if err != nil {
		return err
	}
	if struck && before != 1 {
		run.Violatedf("MySQL holds %d orders for key %s, committed before the crash; want 1", before, key)
	}
	var retry placed
	for try := range 5 {
		if retry = place(ctx, d.client, other.URL, run.FaultSKU, key); retry.status != 0 && retry.status < 500 {
			break
		}
		if try == 4 || clock.Sleep(ctx, 200*time.Millisecond) != nil {
			break
		}
	}
	want := http.StatusOK // the committed order, replayed
	if before == 0 {
		want = http.StatusCreated
	}
	switch {
	case retry.status == want || (want == http.StatusCreated && retry.status == http.StatusConflict):
		// 409: out of stock for a key that was never sold.
		run.Eventf("the retry of %s on %s answered %d %s%s", key, other.Name, retry.status, retry.id, retry.code)
		if retry.status != http.StatusConflict {
			run.Acked(retry.id)
		}
	case retry.status == 0:
		run.Violatedf("the retry of %s on %s got no answer: %s", key, other.Name, retry.err)
	default:
		run.Violatedf("the retry of %s on %s answered %d %s, want %d", key, other.Name, retry.status, retry.code, want)
	}
	n, err := ordersWithKey(ctx, run.Servers.MySQLDSN, key)
	if err != nil {
		return err
	}
	want = 1
	if before == 0 && retry.status == http.StatusConflict {
		want = 0
	}
	if n != want {
		run.Violatedf("MySQL holds %d orders for key %s after the retry (%d before), want %d", n, key, before, want)
	}
	return nil
}

// placed is what one POST /v1/orders got: status 0 when no answer came.
type placed struct {
	status int
	id     string
	code   string // the error answer's code: lock_lost, conflict, ...
	err    error
}

// place sends one order of quantity 1 to base with key.
func place(ctx context.Context, client *http.Client, base, sku, key string) placed {
	body, _ := json.Marshal(map[string]any{"sku": sku, "quantity": 1})
	return postJSON(ctx, client, base+"/v1/orders", body, key)
}

// ordersWithKey counts the orders MySQL holds for an Idempotency-Key.
func ordersWithKey(ctx context.Context, dsn, key string) (int, error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var n int
	err = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM orders WHERE idempotency_key = ?", key).Scan(&n)
	return n, err
}
