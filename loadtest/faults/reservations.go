package faults

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/loadtest"
)

// The reservations' faults (docs/faults.md, "Reservations"): each drives
// reservations of its own on the run's fault SKU, beside the checkouts of
// `--workload reservations`, and catches them at orderd's reservation hook
// points. The invariant check reads the fault SKU too: its stock ledger
// (reservation_moves) counts each reservation's give-backs, so a double
// give-back is seen, not only a wrong sum.

// ReservationSweeperPause freezes (SIGSTOP) a replica in the middle of a
// cancel, at the hook between its reads (the reservation held, the SKU's
// row) and its transaction, holding the SKU's lease; its sweeper, and the
// lock `sweeper` if it holds it, freeze with it. The cancelled hold lives
// a minute, so no sweeper can take it away: the cancel's status change
// will succeed, and only the guard stands between its stale read and the
// row. The replica stays frozen past its leases while another replica's
// sweeper expires the fault's one-second hold on the same SKU and
// checkouts on the other replicas hold and confirm there; then it resumes
// and writes the cancel from its stale read. Guard none overwrites what
// the others wrote (the stock ledger and the row disagree: an oversell);
// version and fencing refuse the write, the cancel runs again from a
// fresh read, and every invariant holds.
//
// A SIGSTOP lands anywhere: it may freeze the replica between a write's
// UPDATE and its COMMIT, the row locked until it runs again. The fault
// makes that certain: a session of its own keeps the row of a second SKU
// of its own locked through the pause, and a hold there falls due first.
// A sweeper reads that row under its lease, waiting for the write in
// flight; the read must end on its deadline and the sweep go on to the
// swept hold. (A read without one kept the pass, and the lock `sweeper`,
// until the replica resumed: no sweeper expired anything in the pause,
// as CI saw once by chance.)
//
// A stale expiry by the frozen sweeper itself cannot do this harm: the
// conditional status change refuses it once another sweeper expired the
// hold (ErrSettled), before the sweeper fence or any stock write.
func ReservationSweeperPause() loadtest.Fault {
	// With none or local there is no lease to outlive.
	return reservationFault(leaseBackends, func(ctx context.Context, run *loadtest.Run, d *driver, db *sql.DB, r, _ *loadtest.Replica) error {
		hook := d.hook
		life := leaseLife(run)

		// The hold the frozen replica cancels: long enough that nothing
		// but the cancel settles it.
		kept := reserve(ctx, d.client, r.URL, run.FaultSKU, 1, 60, run.KeyPrefix+"-cancelled")
		// A hold of one second on the second SKU, whose row stays locked.
		rowSKU := run.FaultSKU + "-row"
		_, err := db.ExecContext(ctx, "INSERT INTO inventory (sku, stock, reserved, version, fence, fence_epoch, created_at, updated_at) "+
			"VALUES (?, 1, 0, 1, 0, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))", rowSKU)
		if err != nil {
			return err
		}
		pinned := reserve(ctx, d.client, r.URL, rowSKU, 1, 1, run.KeyPrefix+"-pinned")
		if pinned.status != http.StatusCreated {
			notFired(run, fmt.Errorf("the hold on %s answered %d %s %v", rowSKU, pinned.status, pinned.code, pinned.err))
			return nil
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		var stock int64
		if err := tx.QueryRowContext(ctx, "SELECT stock FROM inventory WHERE sku = ? FOR UPDATE", rowSKU).Scan(&stock); err != nil {
			return err
		}
		// A hold of three seconds, abandoned: due after the pinned one,
		// another replica's sweeper expires it during the pause.
		swept := reserve(ctx, d.client, r.URL, run.FaultSKU, 1, 3, run.KeyPrefix+"-swept")
		for _, h := range []placed{kept, swept} {
			if h.status != http.StatusCreated {
				notFired(run, fmt.Errorf("a hold of the fault answered %d %s %v", h.status, h.code, h.err))
				return nil
			}
			run.AckedHold(h.id, false)
		}
		run.Eventf("%s held reservations %s for 60 s, to be cancelled, %s for 3 s, to be swept, and %s for 1 s on %s, whose row a session keeps locked through the pause",
			r.Name, kept.id, swept.id, pinned.id, rowSKU)

		caught := hook.expect(func(c *hookCall) bool {
			return c.At == atSettleBeforeWrite && c.Op == "cancel" && c.Reservation == kept.id
		})
		cancel := &sent{Key: kept.id, Replica: r.Name, done: make(chan placed, 1)}
		go func() { cancel.done <- settle(ctx, d.client, r.URL, kept.id, "cancel") }()
		c, err := catch(ctx, caught, cancel, 2*lockWait)
		if err != nil {
			notFired(run, err)
			return nil
		}
		defer c.Answer()
		resume, err := pause(r)
		if err != nil {
			return err
		}
		defer resume()
		t0 := time.Now()
		run.Fired("%s frozen (SIGSTOP) with its sweeper, cancelling %s: %s, holding the SKU's lease", r.Name, kept.id, c)

		// Checkouts on the same SKU through the other replicas while it
		// is frozen: each waits for the frozen lease, then holds and
		// confirms.
		others := othersThan(run, r)
		for i := range 2 {
			via := others[i%len(others)]
			key := fmt.Sprintf("%s-during-pause-%d", run.KeyPrefix, i)
			co := retried(ctx, func() placed { return reserve(ctx, d.client, via.URL, run.FaultSKU, 1, 10, key) })
			if co.status != http.StatusCreated && co.status != http.StatusOK {
				run.Eventf("a checkout on %s during the pause answered %d %s %v", via.Name, co.status, co.code, co.err)
				continue
			}
			s := settleRetried(ctx, d.client, via.URL, co.id, "confirm")
			run.AckedHold(co.id, s.status == http.StatusOK)
			run.Eventf("%s held %s and its confirm answered %d %s, %s into the pause", via.Name, co.id, s.status, s.code, since(t0))
		}
		by, err := awaitSettled(ctx, db, swept.id, 2*life+2*lockWait)
		switch {
		case err != nil:
			run.Eventf("reservation %s not swept during the pause: %v", swept.id, err)
		default:
			run.Eventf("%s's sweeper expired %s %s into the pause", by, swept.id, since(t0))
		}
		_ = clock.Sleep(ctx, 2*life-time.Since(t0))
		if err := tx.Rollback(); err != nil {
			return err
		}
		if err := resume(); err != nil {
			return fmt.Errorf("resume %s: %w", r.Name, err)
		}
		c.Answer()
		p := <-cancel.done
		run.Eventf("%s resumed (SIGCONT) after %s and sent its cancel with the row it read before the pause: %d %s", r.Name, since(t0), p.status, p.code)
		if p.status != http.StatusOK {
			// Refused (fencing: the lease is lost): the client tries
			// again, on another replica (the resumed one's connections
			// to Redis may still be failing).
			p = settleRetried(ctx, d.client, others[0].URL, kept.id, "cancel")
			run.Eventf("the cancel tried again on %s answered %d %s", others[0].Name, p.status, p.code)
		}
		if err := checkGiveBacks(ctx, db, run, swept.id, "expired", 1); err != nil {
			return err
		}
		return checkGiveBacks(ctx, db, run, kept.id, "cancelled", 1)
	})
}

// ReservationKillAfterHold kills (SIGKILL) a replica after a hold committed
// and before it answered, and retries the same Idempotency-Key on another
// replica, as a client whose connection died would. The retry must answer
// 200 with the reservation MySQL holds for the key: one reservation for the
// key, one hold in the ledger, the SKU's reserved up by one line, never a
// second hold. The fault then confirms or cancels it (the seed draws
// which) and starts the killed replica again.
func ReservationKillAfterHold() loadtest.Fault {
	return reservationFault(nil, func(ctx context.Context, run *loadtest.Run, d *driver, db *sql.DB, r, other *loadtest.Replica) error {
		hook := d.hook

		key := run.KeyPrefix + "-hold-killed"
		caught := hook.expect(func(c *hookCall) bool { return c.At == atHoldAfterCommit && c.Key == key })
		first := &sent{Key: key, Replica: r.Name, done: make(chan placed, 1)}
		go func() { first.done <- reserve(ctx, d.client, r.URL, run.FaultSKU, 1, 5, key) }()
		c, err := catch(ctx, caught, first, 2*lockWait)
		if err != nil {
			notFired(run, err)
			return nil
		}
		t0 := time.Now()
		err = r.Kill()
		c.Answer()
		if err != nil {
			return fmt.Errorf("kill %s: %w", r.Name, err)
		}
		run.Fired("%s killed (SIGKILL) after committing hold %s (key %s), before answering", r.Name, c.Reservation, key)
		if p := <-first.done; p.status != 0 {
			run.Violatedf("the killed replica answered %d", p.status)
		}

		retry := retried(ctx, func() placed { return reserve(ctx, d.client, other.URL, run.FaultSKU, 1, 5, key) })
		switch {
		case retry.status == http.StatusOK && retry.id == c.Reservation:
			run.Eventf("the retry on %s answered 200 with reservation %s", other.Name, retry.id)
			run.AckedHold(retry.id, false)
		case retry.status == 0:
			run.Violatedf("the retry on %s got no answer: %v", other.Name, retry.err)
		default:
			run.Violatedf("the retry on %s answered %d %s with reservation %q, want 200 and %s", other.Name, retry.status, retry.code, retry.id, c.Reservation)
			if retry.id != "" {
				run.AckedHold(retry.id, false)
			}
		}
		var n, holds int
		var reserved int64
		err = db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM reservations WHERE idempotency_key = ?), "+
			"(SELECT COUNT(*) FROM reservation_moves WHERE sku = ? AND op = 'hold'), (SELECT reserved FROM inventory WHERE sku = ?)",
			key, run.FaultSKU, run.FaultSKU).Scan(&n, &holds, &reserved)
		if err != nil {
			return err
		}
		if n != 1 || holds != 1 || reserved != 1 {
			run.Violatedf("for key %s MySQL holds %d reservations, %d holds in the ledger and %d reserved; want 1, 1 and 1", key, n, holds, reserved)
		} else {
			run.Eventf("MySQL holds one reservation for the key, one hold, 1 reserved")
		}

		op := []string{"confirm", "cancel"}[run.Rand.IntN(2)]
		s := settleRetried(ctx, d.client, other.URL, c.Reservation, op)
		run.Eventf("the %s on %s answered %d %s, %s after the kill", op, other.Name, s.status, s.code, since(t0))
		if op == "confirm" && s.status == http.StatusOK {
			run.AckedHold(c.Reservation, true)
		}
		if err := r.Start(ctx); err != nil && ctx.Err() == nil {
			return fmt.Errorf("restart %s: %w", r.Name, err)
		}
		run.Eventf("%s started again %s after the kill", r.Name, since(t0))
		return nil
	})
}

// ReservationExpiryRace races a confirm against the reservation's expiry
// at its expires_at. The fault holds for one second and confirms at once
// on another replica; the confirm is kept at the hook before its
// transaction, holding the SKU's lease, and let go at expires_at plus an
// offset the seed draws between -150 ms and +650 ms by MySQL's clock: past
// expires_at the sweepers have found the hold due and wait for the lease
// behind it. Exactly one must win: a 200 with its order and no give-back,
// or a 409 reservation_expired and one give-back by a sweeper.
func ReservationExpiryRace() loadtest.Fault {
	return reservationFault(nil, func(ctx context.Context, run *loadtest.Run, d *driver, db *sql.DB, r, other *loadtest.Replica) error {
		hook := d.hook
		offset := time.Duration(run.Rand.IntN(800)-150) * time.Millisecond

		h := reserve(ctx, d.client, r.URL, run.FaultSKU, 1, 1, run.KeyPrefix+"-raced")
		if h.status != http.StatusCreated {
			notFired(run, fmt.Errorf("the hold to race answered %d %s %v", h.status, h.code, h.err))
			return nil
		}
		run.AckedHold(h.id, false)
		caught := hook.expect(func(c *hookCall) bool {
			return c.At == atSettleBeforeWrite && c.Op == "confirm" && c.Reservation == h.id
		})
		conf := &sent{Key: h.id, Replica: other.Name, done: make(chan placed, 1)}
		go func() { conf.done <- settle(ctx, d.client, other.URL, h.id, "confirm") }()
		c, err := catch(ctx, caught, conf, time.Second)
		if err != nil {
			notFired(run, err)
			return nil
		}
		defer c.Answer()
		var left time.Duration
		var micros int64
		err = db.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) FROM reservations WHERE id = ?", h.id).Scan(&micros)
		if err != nil {
			return err
		}
		left = time.Duration(micros) * time.Microsecond
		_ = clock.Sleep(ctx, left+offset)
		c.Answer()
		run.Fired("the confirm of %s on %s let go at expires_at %+v (MySQL's clock), holding the SKU's lease", h.id, other.Name, offset.Round(time.Millisecond))
		p := <-conf.done
		run.Eventf("the confirm answered %d %s", p.status, p.code)
		switch {
		case p.status == http.StatusOK:
			run.AckedHold(h.id, true)
			return checkGiveBacks(ctx, db, run, h.id, "confirmed", 0)
		case p.status == http.StatusConflict && p.code == "reservation_expired":
			if _, err := awaitSettled(ctx, db, h.id, leaseLife(run)+2*lockWait); err != nil {
				run.Eventf("not swept: %v", err)
			}
			return checkGiveBacks(ctx, db, run, h.id, "expired", 1)
		default:
			run.Violatedf("the confirm answered %d %s, want 200 or 409 reservation_expired", p.status, p.code)
			return nil
		}
	})
}

// reservationFault is a fault of the reservations workload on backends
// (nil: all) whose inject gets the run's driver (its hook), a connection to
// MySQL, the replica the seed draws and the next one.
func reservationFault(backends []string, inject func(ctx context.Context, run *loadtest.Run, d *driver, db *sql.DB, r, next *loadtest.Replica) error) loadtest.Fault {
	return scenario[struct{}]{
		Backends: backends,
		Workload: loadtest.WorkloadReservations,
		Inject: func(ctx context.Context, run *loadtest.Run, d *driver, _ struct{}, r, next *loadtest.Replica) error {
			db, err := sql.Open("mysql", run.Servers.MySQLDSN)
			if err != nil {
				return err
			}
			defer db.Close()
			return inject(ctx, run, d, db, r, next)
		},
	}.fault()
}

// reserve holds quantity of sku for ttl seconds on base, with key ("" for
// none); placed.id is the reservation's.
func reserve(ctx context.Context, client *http.Client, base, sku string, quantity, ttl int, key string) placed {
	body, _ := json.Marshal(map[string]any{"lines": []map[string]any{{"sku": sku, "quantity": quantity}}, "ttl_seconds": ttl})
	return postJSON(ctx, client, base+"/v1/reservations", body, key)
}

// settle confirms or cancels (op) reservation id on base.
func settle(ctx context.Context, client *http.Client, base, id, op string) placed {
	return postJSON(ctx, client, base+"/v1/reservations/"+id+"/"+op, nil, "")
}

func postJSON(ctx context.Context, client *http.Client, url string, body []byte, key string) placed {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return placed{err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return placed{err: err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var o struct {
		ID    string `json:"id"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(b, &o)
	return placed{status: resp.StatusCode, id: o.ID, code: o.Error.Code}
}

// settleRetried is settle retried while it gets no answer, a 503 (a lock
// wait behind a dead or frozen holder) or a 409 the client may retry
// (lock_lost, conflict), a few times.
func settleRetried(ctx context.Context, client *http.Client, base, id, op string) placed {
	return retried(ctx, func() placed { return settle(ctx, client, base, id, op) })
}

// retried calls try until it gets an answer not worth retrying, five
// times at most.
func retried(ctx context.Context, try func() placed) placed {
	var p placed
	for n := range 5 {
		p = try()
		if p.status != 0 && p.status < 500 && p.code != "lock_lost" && p.code != "conflict" {
			return p
		}
		if n == 4 || clock.Sleep(ctx, 200*time.Millisecond) != nil {
			break
		}
	}
	return p
}

// awaitSettled waits up to limit for reservation id to leave held and
// returns the replica that settled it.
func awaitSettled(ctx context.Context, db *sql.DB, id string, limit time.Duration) (string, error) {
	end := time.Now().Add(limit)
	for {
		var status, by string
		err := db.QueryRowContext(ctx, "SELECT status, settled_by FROM reservations WHERE id = ?", id).Scan(&status, &by)
		if err != nil {
			return "", err
		}
		if status != "held" {
			return by, nil
		}
		if time.Now().After(end) {
			return "", fmt.Errorf("still held after %s", limit)
		}
		if err := clock.Sleep(ctx, 50*time.Millisecond); err != nil {
			return "", err
		}
	}
}

// checkGiveBacks checks reservation id's status and its give-backs
// (cancels and expiries) in the stock ledger, and notes any difference as
// a violation.
func checkGiveBacks(ctx context.Context, db *sql.DB, run *loadtest.Run, id, status string, giveBacks int) error {
	var got string
	var n, orders int
	err := db.QueryRowContext(ctx, "SELECT status, (SELECT COUNT(*) FROM reservation_moves WHERE reservation_id = r.id AND op IN ('cancel', 'expire')), "+
		"(SELECT COUNT(*) FROM orders WHERE reservation_id = r.id) FROM reservations r WHERE id = ?", id).Scan(&got, &n, &orders)
	if err != nil {
		return err
	}
	wantOrders := 0
	if status == "confirmed" {
		wantOrders = 1
	}
	if got != status || n != giveBacks || orders != wantOrders {
		run.Violatedf("reservation %s is %s with %d give-backs and %d orders; want %s, %d and %d", id, got, n, orders, status, giveBacks, wantOrders)
		return nil
	}
	run.Eventf("reservation %s is %s, given back %d times, %d orders", id, got, n, orders)
	return nil
}

// byName returns the run's replica named name (OVERSOLD_INSTANCE).
func byName(run *loadtest.Run, name string) *loadtest.Replica {
	for _, r := range run.Fleet.Replicas {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// othersThan returns the run's replicas but r.
func othersThan(run *loadtest.Run, r *loadtest.Replica) []*loadtest.Replica {
	var out []*loadtest.Replica
	for _, x := range run.Fleet.Replicas {
		if x != r {
			out = append(out, x)
		}
	}
	return out
}
