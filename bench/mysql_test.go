package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
)

// getLockWait is the server-side wait of one GET_LOCK call, in seconds; the
// baseline calls again until it has the lock or its ctx ends.
const getLockWait = 10

func BenchmarkMySQL(b *testing.B) {
	dsn := testbed.MySQL(b)
	runServer(b, "mysql", mysqlVersion(b, dsn), []impl{
		ours("mysql", backends.Config{MySQLDSN: dsn},
			"lease row in a MEMORY table (no disk write per grant or release); waiters block in GET_LOCK on the key's named lock, which the holder releases in the statement that deletes the row; renews, fences with epoch·2^40 + AUTO_INCREMENT (epoch bumped durably once per server run)"),
		{
			name: "get-lock",
			wait: fmt.Sprintf("GET_LOCK(name, %d): the server wakes the next waiter; one dedicated connection per contender; no lease, no token", getLockWait),
			open: openGetLock(dsn),
		},
	})
}

// openGetLock is the plain baseline: GET_LOCK and RELEASE_LOCK on one
// dedicated connection per contender (the lock belongs to the connection),
// prepared once, as ours prepares its statements once.
func openGetLock(dsn string) func(ctx context.Context) (*contender, error) {
	return func(ctx context.Context) (*contender, error) {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			return nil, err
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			db.Close()
			return nil, err
		}
		get, err := conn.PrepareContext(ctx, "SELECT GET_LOCK(?, ?)")
		if err != nil {
			conn.Close()
			db.Close()
			return nil, err
		}
		rel, err := conn.PrepareContext(ctx, "SELECT RELEASE_LOCK(?)")
		if err != nil {
			conn.Close()
			db.Close()
			return nil, err
		}
		return &contender{
			lock: func(ctx context.Context, key string) (unlockFunc, error) {
				for {
					var got sql.NullInt64
					if err := get.QueryRowContext(ctx, key, getLockWait).Scan(&got); err != nil {
						return nil, err
					}
					if got.Valid && got.Int64 == 1 {
						break
					}
					// 0: the server-side wait timed out; NULL: an error.
					if !got.Valid {
						return nil, fmt.Errorf("GET_LOCK(%q) returned NULL", key)
					}
					if err := ctx.Err(); err != nil {
						return nil, err
					}
				}
				return func(ctx context.Context) error {
					var ok sql.NullInt64
					if err := rel.QueryRowContext(ctx, key).Scan(&ok); err != nil {
						return err
					}
					if !ok.Valid || ok.Int64 != 1 {
						return fmt.Errorf("RELEASE_LOCK(%q) = %v: not held", key, ok)
					}
					return nil
				}, nil
			},
			close: func() error { return errors.Join(get.Close(), rel.Close(), conn.Close(), db.Close()) },
		}, nil
	}
}

func mysqlVersion(b *testing.B, dsn string) string {
	b.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		b.Fatalf("mysql: %v", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Second)
	defer cancel()
	var v string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		b.Fatalf("mysql: %v", err)
	}
	num, _, _ := strings.Cut(v, "-")
	if strings.Contains(v, "MariaDB") {
		return "MariaDB " + num
	}
	return "MySQL " + num
}
