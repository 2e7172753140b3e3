package namedqueue_test

import (
	"database/sql"
	"testing"

	"github.com/oversold-lab/oversold/locking/mysqllock/internal/mysqllocktest"
)

// table is the hardened composition's lease table (the memtable's).
const table = "oversold_leases"

func openDB(t *testing.T, dsn string) *sql.DB { return mysqllocktest.OpenDB(t, dsn) }

func waitFor(t *testing.T, cond func() bool) { mysqllocktest.WaitFor(t, cond) }
