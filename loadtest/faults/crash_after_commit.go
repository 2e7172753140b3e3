package faults

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/oversold-lab/oversold/loadtest"
)

// CrashAfterCommit kills a replica after its order committed and before it
// answered, then retries the same Idempotency-Key on another replica, as a
// client whose connection died would. The fault drives that one order
// itself, alongside the load, on the run's fault SKU (the load may have
// sold the others out): it goes straight to the seeded victim, which
// is killed (SIGKILL) at the hook after COMMIT (and after the cache update,
// before the release and the reply). The retry must answer 200 with the
// order MySQL holds for the key, one order for the key, one decrement: the
// dedupe lives in the order transaction (a UNIQUE key), not beside it. The
// victim is started again afterwards.
func CrashAfterCommit() loadtest.Fault {
	var runs perRun[*insideHook]
	return loadtest.Fault{
		Prepare: hookPrepare(&runs),
		Inject: func(ctx context.Context, run *loadtest.Run) error {
			hook, err := runs.get(run)
			if err != nil {
				return err
			}
			r, other, err := replicas(run)
			if err != nil {
				return err
			}
			ctx, d := drive(ctx, run, hook)
			defer d.close()
			victim, first := d.enter(ctx, r, atAfterCommit, "crash")
			if victim == nil {
				return nil
			}
			key, sku := first.Key, run.FaultSKU
			t0 := time.Now()
			err = r.Kill()
			victim.Answer()
			if err != nil {
				return fmt.Errorf("kill %s: %w", r.Name, err)
			}
			run.Fired("%s killed (SIGKILL) after committing order key %s, before answering", victim, key)
			if p := <-first.done; p.status != 0 {
				run.Violatedf("the killed replica answered %d", p.status)
			}

			// The client retries the key on the next replica, a few times.
			var retry placed
			for try := range 5 {
				if retry = place(ctx, d.client, other.URL, sku, key); retry.status != 0 && retry.status < 500 {
					break
				}
				if try == 4 || sleepCtx(ctx, 200*time.Millisecond) != nil {
					break
				}
			}
			switch {
			case retry.status == http.StatusOK:
				run.Eventf("the retry on %s answered 200 with order %s", other.Name, retry.id)
				run.Acked(retry.id)
			case retry.status == 0:
				run.Violatedf("the retry on %s got no answer: %s", other.Name, retry.err)
			default:
				run.Violatedf("the retry on %s answered %d, want 200 and the committed order", other.Name, retry.status)
			}
			n, err := ordersWithKey(ctx, run.Servers.MySQLDSN, key)
			if err != nil {
				return err
			}
			if n != 1 {
				run.Violatedf("MySQL holds %d orders for key %s, want 1", n, key)
			} else {
				run.Eventf("MySQL holds exactly one order for the key")
			}

			if err := r.Start(ctx); err != nil && ctx.Err() == nil {
				return fmt.Errorf("restart %s: %w", r.Name, err)
			}
			run.Eventf("%s started again %s after the kill", r.Name, since(t0))
			return nil
		},
	}
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
