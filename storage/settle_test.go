package storage_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/storage"
)

// TestPutInventoryCreatesConcurrently: admins create distinct new SKUs at
// once. Their SKU locks do not serialise them, and under REPEATABLE READ
// their locking reads of missing rows shared a gap lock that each INSERT
// then waited for: MySQL killed about half of them as deadlock victims.
func TestPutInventoryCreatesConcurrently(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	base := "new-" + uuid.NewString()[:6]
	const rounds, creators = 10, 4
	var failed []error
	var mu sync.Mutex
	for round := range rounds {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range creators {
			wg.Go(func() {
				<-start
				sku := fmt.Sprintf("%s-%02d-%d", base, round, g)
				if _, err := s.PutInventory(t.Context(), storage.Put{SKU: sku, Stock: int64(g + 1)}); err != nil {
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d creations of distinct new SKUs failed, the first: %v", len(failed), rounds*creators, failed[0])
	}
	for round := range rounds {
		for g := range creators {
			sku := fmt.Sprintf("%s-%02d-%d", base, round, g)
			if a := audit(t, s, sku); a.Stock != int64(g+1) {
				t.Errorf("%s: stock %d, want %d", sku, a.Stock, g+1)
			}
		}
	}
}

// TestStaleSweeperRefused: a sweeper whose token is below the sweeper
// fence (a newer sweeper has expired with a greater one) is refused, and
// its expiry writes nothing, whatever clientFoundRows the DSN sets: with
// it, MySQL reported the fence's unchanged row as one row affected, and the
// refusal went unseen.
func TestStaleSweeperRefused(t *testing.T) {
	t.Parallel()
	dsn := testbed.MySQL(t)
	for _, found := range []bool{false, true} {
		t.Run(fmt.Sprintf("clientFoundRows=%v", found), func(t *testing.T) {
			cfg, err := mysql.ParseDSN(dsn)
			if err != nil {
				t.Fatal(err)
			}
			cfg.ClientFoundRows = found
			s, err := storage.Open(t.Context(), cfg.FormatDSN())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			sku := "sweep-" + uuid.NewString()[:8]
			put(t, s, sku, 10)
			a, b, c := hold(t, s, sku, 0), hold(t, s, sku, 0), hold(t, s, sku, 0)
			waitDue(t, s, c)

			if _, _, err := expire(t, s, a, 100); err != nil {
				t.Fatalf("expiry under token 100: %v", err)
			}
			_, _, err = expire(t, s, b, 5) // an older sweeper, paused past its lease
			if !errors.Is(err, storage.ErrStaleSweeper) {
				t.Fatalf("expiry under token 5 after one under 100: %v, want %v", err, storage.ErrStaleSweeper)
			}
			if r, _ := s.Reservation(t.Context(), b); r.Status != storage.StatusHeld {
				t.Errorf("the refused expiry left the reservation %s, want held", r.Status)
			}
			if a := audit(t, s, sku); a.Stock != 8 || a.Reserved != 2 {
				t.Errorf("stock %d reserved %d after one expiry of three holds of 1, want 8 and 2", a.Stock, a.Reserved)
			}
			// The sweeper that raised the fence expires on under its token.
			if _, _, err := expire(t, s, c, 100); err != nil {
				t.Errorf("a second expiry under token 100: %v", err)
			}
		})
	}
}

// TestSettleOnce: two settlements of one held reservation run at once, in
// storage (no pre-read of the status to catch the second), and exactly one
// of them settles it: the status change is conditional on held. The first
// is stopped after its status change (its stock write waits for a row lock
// held by another session), the second then waits for the reservation's
// row; the atomic guard adds the moves in place (and another hold keeps
// reserved above 0), so only that condition stops a second give-back.
func TestSettleOnce(t *testing.T) {
	t.Parallel()
	s, db := openStoreAndDB(t)

	for _, c := range []struct {
		first, second string
		// pastExpiry: the second runs once MySQL's clock passed the hold's
		// expires_at (the first before it).
		pastExpiry bool
	}{
		{storage.StatusConfirmed, storage.StatusExpired, true},
		{storage.StatusCancelled, storage.StatusCancelled, false},
		{storage.StatusConfirmed, storage.StatusCancelled, false},
	} {
		t.Run(c.first+"/"+c.second, func(t *testing.T) {
			sku := "once-" + uuid.NewString()[:8]
			put(t, s, sku, 10)
			ttl := time.Minute
			if c.pastExpiry {
				ttl = 1500 * time.Millisecond
			}
			id := hold(t, s, sku, ttl)
			// Another hold of the SKU: reserved cannot go negative, so the
			// atomic guard would let a second give-back through.
			hold(t, s, sku, time.Hour)

			// Another session holds the SKU's row: the first settlement
			// stops at its stock write, its status change made.
			blocker, err := db.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer blocker.Rollback()
			if _, err := blocker.ExecContext(t.Context(), "SELECT stock FROM inventory WHERE sku = ? FOR UPDATE", sku); err != nil {
				t.Fatal(err)
			}
			errs := make([]error, 2)
			var wg sync.WaitGroup
			settle := func(i int, to string) {
				wg.Go(func() { _, _, errs[i] = settleTo(t.Context(), s, id, to) })
			}
			settle(0, c.first)
			waitStatement(t, db, "UPDATE inventory") // its status changed
			if c.pastExpiry {
				waitDue(t, s, id)
			}
			settle(1, c.second)
			waitStatement(t, db, "UPDATE reservations") // behind the first's row lock
			if err := blocker.Commit(); err != nil {
				t.Fatal(err)
			}
			wg.Wait()

			if errs[0] != nil {
				t.Errorf("first settlement (%s): %v", c.first, errs[0])
			}
			if !errors.Is(errs[1], storage.ErrSettled) {
				t.Errorf("second settlement (%s) of a reservation the first settled: %v, want %v", c.second, errs[1], storage.ErrSettled)
			}
			r, err := s.Reservation(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			wantStock, wantOrdered := int64(9), int64(0) // the other hold keeps 1
			if c.first == storage.StatusConfirmed {
				wantStock, wantOrdered = 8, 1
			}
			a := audit(t, s, sku)
			if r.Status != c.first || a.Stock != wantStock || a.Reserved != 1 || a.Ordered != wantOrdered {
				t.Errorf("reservation %s, stock %d reserved %d ordered %d; want %s, %d, 1, %d",
					r.Status, a.Stock, a.Reserved, a.Ordered, c.first, wantStock, wantOrdered)
			}
		})
	}
}

// hold holds 1 of sku for ttl (0: a microsecond) under the atomic guard
// and returns the reservation's id.
func hold(t *testing.T, s *storage.Store, sku string, ttl time.Duration) string {
	t.Helper()
	if ttl == 0 {
		ttl = time.Microsecond
	}
	r := storage.Reservation{ID: uuid.Must(uuid.NewV7()).String(), Lines: storage.Lines{{SKU: sku, Quantity: 1}}, Instance: "t", Lock: "none"}
	if _, _, err := s.Hold(t.Context(), storage.GuardAtomic, r, ttl, []storage.Move{{Seen: storage.Inventory{SKU: sku}, Stock: -1, Reserved: 1}}); err != nil {
		t.Fatal(err)
	}
	return r.ID
}

// settleTo moves reservation id (1 of one SKU) to status to under the
// atomic guard, as settleOnce would without its pre-read.
func settleTo(ctx context.Context, s *storage.Store, id, to string) (storage.Reservation, []storage.Inventory, error) {
	r, err := s.Reservation(ctx, id)
	if err != nil {
		return storage.Reservation{}, nil, err
	}
	l := r.Lines[0]
	st := storage.Settlement{ID: id, To: to, By: "t-" + to}
	m := storage.Move{Seen: storage.Inventory{SKU: l.SKU}, Stock: l.Quantity, Reserved: -l.Quantity}
	if to == storage.StatusConfirmed {
		m.Stock = 0
		st.Orders = []storage.Order{newOrder(l.SKU, l.Quantity, "")}
		st.Orders[0].ReservationID = &id
	}
	return s.Settle(ctx, storage.GuardAtomic, st, []storage.Move{m})
}

// expire is a sweeper's expiry of reservation id under token, at epoch 0.
func expire(t *testing.T, s *storage.Store, id string, token uint64) (storage.Reservation, []storage.Inventory, error) {
	t.Helper()
	r, err := s.Reservation(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	l := r.Lines[0]
	st := storage.Settlement{ID: id, To: storage.StatusExpired, By: "sweeper", SweepToken: token}
	return s.Settle(t.Context(), storage.GuardAtomic, st, []storage.Move{{Seen: storage.Inventory{SKU: l.SKU}, Stock: l.Quantity, Reserved: -l.Quantity}})
}

// waitDue waits until reservation id is due by MySQL's clock.
func waitDue(t *testing.T, s *storage.Store, id string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		due, err := s.DueReservations(t.Context(), storage.Reservation{}, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range due {
			if d.ID == id {
				return
			}
		}
	}
	t.Fatalf("reservation %s not due after 10s", id)
}

// waitStatement waits until a session of this test's database runs a
// statement that starts with prefix (one that stays there waits for a
// row lock).
func waitStatement(t *testing.T, db *sql.DB, prefix string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var n int
		err := db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND INFO LIKE CONCAT(?, '%')`, prefix).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
	}
	t.Fatalf("no session runs %q after 10s", prefix)
}
