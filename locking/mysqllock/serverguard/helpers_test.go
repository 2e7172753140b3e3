package serverguard_test

import (
	"database/sql"
	"testing"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/mysqllock/internal/mysqllocktest"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func openDB(t *testing.T, dsn string) *sql.DB { return mysqllocktest.OpenDB(t, dsn) }

func mustExec(t *testing.T, db *sql.DB, q string) { mysqllocktest.MustExec(t, db, q) }
