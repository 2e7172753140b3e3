package order_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking/backends"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// killBeforeCommit kills, from another session, the connection of the
// first write's transaction once its statements have run, just before its
// COMMIT: MySQL rolls it back, and the service is told only that the
// connection broke (the outcome it cannot know without asking MySQL).
type killBeforeCommit struct {
	order.Store
	t    *testing.T
	db   *sql.DB
	once *sync.Once
}

func (s killBeforeCommit) PlaceOrder(ctx context.Context, w storage.Write, beforeCommit func() error) (storage.Inventory, error) {
	return s.Store.PlaceOrder(ctx, w, func() error {
		if beforeCommit != nil {
			if err := beforeCommit(); err != nil {
				return err
			}
		}
		s.once.Do(func() { killWriter(s.t, s.db) })
		return nil
	})
}

// killWriter kills the connection of the transaction of the test's
// database that has written rows and runs no statement: the one between
// its last statement and its COMMIT (others wait in theirs for its row).
// INNODB_TRX is a snapshot that MySQL refreshes only when it was not read
// for 100 ms: it is asked again, less often than that, until it shows the
// transaction.
func killWriter(t *testing.T, db *sql.DB) {
	var id int64
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		err = db.QueryRow(`SELECT t.trx_mysql_thread_id FROM information_schema.INNODB_TRX t
			JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
			WHERE p.DB = DATABASE() AND t.trx_rows_modified > 0 AND p.INFO IS NULL`).Scan(&id)
		if !errors.Is(err, sql.ErrNoRows) {
			break
		}
	}
	if err == nil {
		_, err = db.Exec(fmt.Sprintf("KILL CONNECTION %d", id))
	}
	if err != nil {
		t.Errorf("kill the writer's connection: %v", err)
	}
}

// TestCommitNotCommitted: the connection of an order's transaction is
// killed just before its COMMIT, so nothing is committed and the service
// gets a broken connection, not a refusal. The order is answered 503 and
// is not in MySQL; the others are answered as MySQL has them: every 201 is
// an order in MySQL and nothing else is. An implementation that took the
// broken connection for a commit (201 without asking MySQL) acknowledges
// an order that does not exist. Without a lock (one order a write) and
// under the redis lock, where orders queued behind a held lease are written
// together: the killed write may carry several.
func TestCommitNotCommitted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := f.rawDB(t)
	for _, c := range []struct {
		lock  string
		guard storage.Guard
	}{
		{"none", storage.GuardVersion},
		{"redis", storage.GuardFencing},
	} {
		t.Run(c.lock, func(t *testing.T) {
			sku := "kill-" + c.lock
			const initial = 20
			f.stock(sku, initial)
			var locker order.Locker
			cfg := order.Config{Guard: c.guard}
			if c.lock == "redis" {
				l, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: f.redis, TTL: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
				locker, cfg.Lock, cfg.LockWait = l, "redis", 10*time.Second
			}
			store := killBeforeCommit{Store: f.openStore(), t: t, db: db, once: &sync.Once{}}
			h := f.serviceWith(store, nil, locker, cfg).Handler()

			const clients = 6
			codes := make([]int, clients)
			ids := make([]string, clients)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range clients {
				wg.Go(func() {
					<-start
					rec := post(h, sku, 1)
					codes[i] = rec.Code
					var o struct{ ID string }
					json.Unmarshal(rec.Body.Bytes(), &o)
					ids[i] = o.ID
				})
			}
			close(start)
			wg.Wait()

			created, unavailable := 0, 0
			for i, code := range codes {
				switch code {
				case http.StatusCreated:
					created++
					if _, err := f.store.Order(t.Context(), ids[i]); err != nil {
						t.Errorf("order %s answered 201: %v", ids[i], err)
					}
				case http.StatusServiceUnavailable:
					unavailable++
				default:
					t.Errorf("order answered %d", code)
				}
			}
			a := f.audit(sku)
			t.Logf("%v: %d created, %d unavailable; MySQL: %d orders, stock %d", codes, created, unavailable, a.Orders, a.Stock)
			if unavailable == 0 {
				t.Errorf("no order answered 503: the killed write was answered as committed")
			}
			if a.Orders != int64(created) || a.Stock != initial-int64(created) {
				t.Errorf("MySQL has %d orders and stock %d; %d were acknowledged (want stock %d)", a.Orders, a.Stock, created, initial-created)
			}
		})
	}
}
