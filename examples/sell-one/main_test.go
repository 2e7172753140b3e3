package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func stockTable(t *testing.T) (*sql.DB, string) {
	t.Helper()
	dsn := testbed.MySQL(t)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.ExecContext(t.Context(), Schema); err != nil {
		t.Fatal(err)
	}
	return db, dsn
}

func quantity(t *testing.T, db *sql.DB, sku string) int {
	t.Helper()
	var q int
	if err := db.QueryRowContext(t.Context(), "SELECT quantity FROM stock WHERE sku = ?", sku).Scan(&q); err != nil {
		t.Fatal(err)
	}
	return q
}

// TestSellUnderContention: three replicas (a Locker each, on a real Redis
// and MariaDB) with 8 clients each, released at once, sell a stock of 10:
// exactly 10 sales succeed and the row ends at 0, under every guard. With
// lock local the replicas' locks do not exclude each other, so the version
// guard alone keeps the count: without its "AND version = ?" this oversells.
func TestSellUnderContention(t *testing.T) {
	db, dsn := stockTable(t)
	cfg := backends.Config{RedisAddr: testbed.Redis(t), MySQLDSN: dsn}
	const stock, replicas, clients = 10, 3, 8
	for _, c := range []struct{ lock, guard string }{
		{"local", "version"}, {"redis", "version"}, {"redis", "fencing"}, {"none", "atomic"},
	} {
		t.Run(c.lock+"/"+c.guard, func(t *testing.T) {
			sku := "sku-" + c.lock + "-" + c.guard
			if _, err := db.ExecContext(t.Context(), "INSERT INTO stock (sku, quantity) VALUES (?, ?)", sku, stock); err != nil {
				t.Fatal(err)
			}
			lockers := make([]locking.Locker, replicas)
			for i := range lockers {
				if c.lock == "none" {
					continue
				}
				l, err := backends.Open(t.Context(), c.lock, cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
				lockers[i] = l
			}
			var sold, refused atomic.Int64
			start := make(chan struct{})
			var wg sync.WaitGroup
			for r := range replicas {
				for range clients {
					wg.Go(func() {
						<-start
						for {
							err := Sell(t.Context(), lockers[r], db, c.guard, sku)
							switch {
							case err == nil:
								sold.Add(1)
							case errors.Is(err, ErrRefused):
								refused.Add(1) // re-read and try again
							case errors.Is(err, ErrSoldOut):
								return
							default:
								t.Error(err)
								return
							}
						}
					})
				}
			}
			close(start)
			wg.Wait()
			if got, left := sold.Load(), quantity(t, db, sku); got != stock || left != 0 {
				t.Errorf("sold %d of %d, %d left (%d refused writes retried)", got, stock, left, refused.Load())
			}
		})
	}
}

// TestRunSellsOne runs the program's main logic as a team would call it.
func TestRunSellsOne(t *testing.T) {
	db, dsn := stockTable(t)
	if _, err := db.ExecContext(t.Context(), "INSERT INTO stock (sku, quantity) VALUES ('sku-1', 2)"); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	args := []string{"-lock", "redis", "-redis", testbed.Redis(t), "-dsn", dsn, "-guard", "fencing", "sku-1"}
	if err := run(context.Background(), args, &out); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "sold 1 of sku-1 under redis/fencing\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}
	if q := quantity(t, db, "sku-1"); q != 1 {
		t.Errorf("quantity %d after one sale of 2, want 1", q)
	}
}
