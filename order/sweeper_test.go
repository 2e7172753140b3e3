package order_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// TestSweepSkipsRefusedSKU: under the redis lock and guard fencing, the
// oldest due holds, more than a batch of them, are on a SKU whose fence is
// ahead of the backend's tokens (another backend's, or a Redis restarted
// without persistence), so their expiry is refused on every pass. The
// sweep goes on past them and expires the younger ones; only the sweeper
// fence refusing (a newer sweeper took over) stops a pass. A sweeper that
// stopped at any refusal expired at most the few it had launched
// alongside the refused one; one that read its batches from the oldest
// due hold each time read the refused ones again and again and never
// reached the others.
func TestSweepSkipsRefusedSKU(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	locker, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Close() })
	// No Start: the sweeper runs only when the test calls Sweep.
	svc := f.service(locker, order.Config{Lock: "redis", Guard: storage.GuardFencing, LockWait: 10 * time.Second})
	h := svc.Handler()
	const stuck, free = 101, 12 // more than a batch; more than a pass launches at once
	f.stock("swept-stuck", stuck)
	f.stock("swept-free", 50)
	stuckIDs := make([]string, stuck)
	for i := range stuckIDs {
		stuckIDs[i] = decodeReservation(t, hold(h, 1, "", "swept-stuck", 1)).ID
	}
	time.Sleep(5 * time.Millisecond) // due after them
	ids := make([]string, free)
	for i := range ids {
		ids[i] = decodeReservation(t, hold(h, 1, "", "swept-free", 1)).ID
	}
	db := f.rawDB(t)
	if _, err := db.ExecContext(t.Context(), "UPDATE inventory SET fence = ? WHERE sku = ?", uint64(1)<<40, "swept-stuck"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)

	n, err := svc.Sweep(t.Context())
	if err != nil || n != free {
		t.Fatalf("sweep expired %d (%v), want the %d holds of the SKU the sweeper may write", n, err, free)
	}
	for _, id := range ids {
		wantStatus(t, f, id, storage.StatusExpired)
	}
	for _, id := range stuckIDs {
		wantStatus(t, f, id, storage.StatusHeld) // due, not swept
	}
	wantInv(t, h, "swept-free", 50, 0)
	wantInv(t, h, "swept-stuck", 0, stuck)

	// A newer sweeper has written: this one's pass stops, expiring nothing.
	more := decodeReservation(t, hold(h, 1, "", "swept-free", 1))
	if _, err := db.ExecContext(t.Context(), "UPDATE fences SET fence = ? WHERE name = ?", uint64(1)<<40, storage.SweeperFence); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), "UPDATE inventory SET fence = 0 WHERE sku = ?", "swept-stuck"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	n, err = svc.Sweep(t.Context())
	if n != 0 || !errors.Is(err, order.ErrLockLost) || !errors.Is(err, storage.ErrStaleSweeper) {
		t.Fatalf("sweep behind a newer sweeper's fence: expired %d (%v), want 0 and %v", n, err, storage.ErrStaleSweeper)
	}
	wantStatus(t, f, more.ID, storage.StatusHeld)
}

// wantStatus checks reservation id's status in MySQL (the API shows a due
// hold as expired, swept or not).
func wantStatus(t *testing.T, f *fixture, id, status string) {
	t.Helper()
	r, err := f.store.Reservation(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != status {
		t.Errorf("reservation %s: status %q in MySQL, want %q", id, r.Status, status)
	}
}

// TestSweepPastAFrozenWriter: a replica frozen (SIGSTOP, GC) between a
// write's UPDATE and its COMMIT keeps the SKU's row locked: here another
// session holds it, on the SKU of the older due holds. Two replicas sweep
// under the redis lock, one at a time. The sweeper that takes one of those
// holds reads the row under its lease, as every lease holder does (it
// waits for the write in flight); that read must end on its deadline, the
// pass must leave the SKU's other holds to the next pass, and go on to the
// younger due hold on another SKU, due after that pass began. A read
// without a deadline kept the pass, the lock `sweeper` and the SKU's lease
// until the frozen writer ran again (or MySQL's lock wait gave up, 50 s):
// no sweeper expired anything meanwhile, as CI saw in
// TestReservationSweeperPause. A pass that tried every hold of the SKU
// waited for the row once per hold, one after another behind its lease.
func TestSweepPastAFrozenWriter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const stuck = 8
	f.stock("frozen-row", stuck)
	f.stock("frozen-free", 5)
	var svcs []*order.Service
	for i := range 2 {
		locker, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { locker.Close() })
		svcs = append(svcs, f.service(locker, order.Config{Instance: fmt.Sprintf("frozen-%d", i), Lock: "redis",
			SweepInterval: 200 * time.Millisecond}))
	}
	h := svcs[0].Handler()
	var old []string
	for range stuck {
		old = append(old, decodeReservation(t, hold(h, 1, "", "frozen-row", 1)).ID)
	}
	young := decodeReservation(t, hold(h, 3, "", "frozen-free", 1))

	tx, err := f.rawDB(t).BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var stock int64
	if err := tx.QueryRow("SELECT stock FROM inventory WHERE sku = ? FOR UPDATE", "frozen-row").Scan(&stock); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	var sweeps sync.WaitGroup
	defer sweeps.Wait()
	defer stop()
	defer tx.Rollback() // before the sweeps are waited for: a pinned one waits for it
	for _, svc := range svcs {
		sweeps.Go(func() {
			for ctx.Err() == nil {
				svc.Sweep(ctx)
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
	// The young hold is due 3 s after it was held. A sweeper expires it
	// in the first pass that starts after that (a pass waits once for the
	// locked row, 2 s, and its lease), or the pass after: in 2 to 5 s
	// here at a load of 20 on 2 cores; 8 s is the bound.
	limit := time.Until(young.ExpiresAt) + 8*time.Second
	if !awaitStatus(t, f, young.ID, storage.StatusExpired, limit) {
		t.Fatalf("the younger due hold, on a SKU nobody holds, still held %v after it was due, its older neighbours' row locked by a frozen writer", time.Since(young.ExpiresAt).Round(100*time.Millisecond))
	}
	t.Logf("the younger hold expired %v after it was due", time.Since(young.ExpiresAt).Round(100*time.Millisecond))
	for _, id := range old {
		wantStatus(t, f, id, storage.StatusHeld) // their row is still locked
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	for _, id := range old {
		if !awaitStatus(t, f, id, storage.StatusExpired, 10*time.Second) {
			t.Fatalf("an older hold still held 10 s after its row was free")
		}
	}
	stop()
	sweeps.Wait()
	for _, sku := range []string{"frozen-row", "frozen-free"} {
		if a := f.audit(sku); a.Stock+a.Ordered != map[string]int64{"frozen-row": stuck, "frozen-free": 5}[sku] || a.Reserved != 0 {
			t.Errorf("%s: %+v, want every unit back in stock, reserved 0", sku, a)
		}
	}
}

// awaitStatus waits up to limit for reservation id to reach status in
// MySQL.
func awaitStatus(t *testing.T, f *fixture, id, status string, limit time.Duration) bool {
	t.Helper()
	for end := time.Now().Add(limit); ; time.Sleep(50 * time.Millisecond) {
		r, err := f.store.Reservation(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status == status {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// lateStore commits a hold's or a settle's write, then answers only once
// the write's context has ended, with its error: a commit acknowledged
// after the write's deadline (MySQL or the network slow).
type lateStore struct{ order.Store }

func (s lateStore) Hold(ctx context.Context, guard storage.Guard, r storage.Reservation, ttl time.Duration, moves []storage.Move) (storage.Reservation, []storage.Inventory, error) {
	held, after, err := s.Store.Hold(context.WithoutCancel(ctx), guard, r, ttl, moves)
	if err != nil {
		return held, after, err
	}
	<-ctx.Done()
	return storage.Reservation{}, nil, ctx.Err()
}

func (s lateStore) Settle(ctx context.Context, guard storage.Guard, st storage.Settlement, moves []storage.Move) (storage.Reservation, []storage.Inventory, error) {
	done, after, err := s.Store.Settle(context.WithoutCancel(ctx), guard, st, moves)
	if err != nil {
		return done, after, err
	}
	<-ctx.Done()
	return storage.Reservation{}, nil, ctx.Err()
}

// TestOutcomeLookedUpAfterTheDeadline: a hold and a sweeper's expiry whose
// commits are acknowledged only after their write's deadline (10 s) ask
// MySQL whether they committed, on a context of their own: the hold is
// answered 201, the expiry counted. On the write's own context, which has
// run out, the lookup failed: the hold answered 503 ("nothing was
// written") although it was held, and the sweep counted nothing.
func TestOutcomeLookedUpAfterTheDeadline(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("late-hold", 5)
	f.stock("late-expire", 5)
	plain := f.service(local.New(), order.Config{Lock: "local"}).Handler()
	due := decodeReservation(t, hold(plain, 1, "", "late-expire", 1))
	late := f.serviceWith(lateStore{f.openStore()}, nil, local.New(), order.Config{Instance: "late", Lock: "local"})
	time.Sleep(1100 * time.Millisecond)

	var wg sync.WaitGroup
	var rec *httptest.ResponseRecorder
	wg.Go(func() { rec = hold(late.Handler(), 60, "", "late-hold", 2) })
	n, err := late.Sweep(t.Context())
	wg.Wait()
	if rec.Code != http.StatusCreated {
		t.Errorf("hold committed late: answered %d %s, want 201", rec.Code, rec.Body)
	} else if r := decodeReservation(t, rec); r.Status != "held" {
		t.Errorf("hold committed late: %+v, want held", r)
	}
	if a := f.audit("late-hold"); a.Reserved != 2 {
		t.Errorf("late-hold: reserved %d, want 2: the hold did not commit, nothing to check", a.Reserved)
	}
	if n != 1 || err != nil {
		t.Errorf("sweep with a late commit counted %d expired (%v), want 1", n, err)
	}
	wantStatus(t, f, due.ID, storage.StatusExpired)
}

// TestLeasesLoggedAtDebug: at info a replica logs its start, settings and
// failures, not every lease and sweep: an order, a hold, its confirm and
// a sweep pass under the redis lock (a lease each, the sweeper's too) log
// no lease record at info; at debug each lease has one.
func TestLeasesLoggedAtDebug(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.stock("quiet", 10)
	locker, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Close() })
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	svc := f.service(locker, order.Config{Lock: "redis", Logger: log})
	h := svc.Handler()
	wantCode(t, post(h, "quiet", 1), 201, "")
	r := decodeReservation(t, hold(h, 60, "", "quiet", 1))
	wantCode(t, settle(h, r.ID, "confirm"), 200, "")
	if _, err := svc.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	leases := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec struct{ Level, Msg, Key string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec.Msg == order.LeaseRecord {
			leases[rec.Level+" "+rec.Key]++
		}
	}
	want := map[string]int{"DEBUG sku/quiet": 3, "DEBUG sweeper": 1}
	if !maps.Equal(leases, want) {
		t.Errorf("lease records by level and key %v, want %v", leases, want)
	}
}

// syncBuffer is a bytes.Buffer safe for the replica's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
