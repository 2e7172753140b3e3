package faults

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/loadtest"
)

// connectionKills is how many times a run kills connections.
const connectionKills = 3

// innodbTrxRefresh is a little over InnoDB's information_schema cache
// period (TRX_I_S_MEM_LIMIT's companion, 100 ms in trx0i_s.cc).
const innodbTrxRefresh = 150 * time.Millisecond

// MySQLConnectionKill kills the replicas' MariaDB connections in the middle
// of their order transactions, a few times per run. The fault drives those
// orders itself, on the run's fault SKU, one replica after another: a batch
// on each (enterBatch) is caught at the hook before COMMIT (its guarded UPDATE and order INSERT
// sent, not committed), every connection to the run's database with an open
// InnoDB transaction is killed (KILL CONNECTION), load's included, then the
// replica goes on and its COMMIT fails. MariaDB rolls the whole transaction
// back: no partial order (a stock write without its order, or the
// reverse), and since the client got no 201 for it, no acknowledged order
// is lost.
//
// With --accept queue the orders are answered 202 before any write: the
// transaction struck is a queue consumer's batch (any replica's, the
// first to write the fault's orders), whose failed COMMIT leaves its
// entries unacknowledged; the consumer writes them again (or another
// claims them), so each 202 must still end confirmed or rejected, once:
// the run's lost_accepted, pending_left and duplicates say whether it did.
func MySQLConnectionKill() loadtest.Fault {
	return scenario[struct{}]{
		Replicas: oneReplica,
		Inject: func(ctx context.Context, run *loadtest.Run, d *driver, _ struct{}, struck, _ *loadtest.Replica) error {
			cfg, err := mysql.ParseDSN(run.Servers.MySQLDSN)
			if err != nil {
				return err
			}
			db, err := sql.Open("mysql", run.Servers.MySQLDSN)
			if err != nil {
				return err
			}
			defer db.Close()
			first := slices.Index(run.Fleet.Replicas, struck)
			for i := range connectionKills {
				r := run.Fleet.Replicas[(first+i)%len(run.Fleet.Replicas)]
				name := fmt.Sprintf("killed-conn-%d", i+1)
				var c *hookCall
				var o *sent
				if run.Spec.Accept == "queue" {
					// The orders are answered 202 by r and written by a
					// consumer (any replica's): its batch is struck.
					var batch []*sent
					c, batch = d.enterQueued(ctx, r, atBeforeCommit, name)
					o = batch[0]
				} else {
					c, o, _ = d.enterBatch(ctx, r, atBeforeCommit, name)
				}
				if c == nil {
					continue
				}
				n, err := killOpenTransactions(ctx, db, cfg.DBName)
				c.Answer()
				if err != nil {
					return fmt.Errorf("kill connections: %w", err)
				}
				msg := "%s about to commit: killed %d MariaDB %s with an open transaction"
				if n > 0 {
					run.Fired(msg, c, n, plural(n, "connection", "connections"))
				} else {
					run.Eventf(msg, c, n, plural(n, "connection", "connections"))
				}
				d.wait(ctx, o, lockWait)
			}
			return nil
		},
	}.fault()
}

// killOpenTransactions kills every connection to database dbName that has
// an InnoDB transaction open, except its own, and says how many.
func killOpenTransactions(ctx context.Context, db *sql.DB, dbName string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// InnoDB refreshes what information_schema.innodb_trx shows at most
	// every 100 ms: wait that out, or a transaction just killed (or one just
	// begun) would be missed. The replica waits in its hook meanwhile.
	if err := clock.Sleep(ctx, innodbTrxRefresh); err != nil {
		return 0, err
	}
	conn, err := db.Conn(ctx) // one connection: CONNECTION_ID() is ours
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	rows, err := conn.QueryContext(ctx, `SELECT p.id FROM information_schema.innodb_trx t
		JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id
		WHERE p.db = ? AND p.id <> CONNECTION_ID()`, dbName)
	if err != nil {
		return 0, err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	killed := 0
	for _, id := range ids {
		// The connection may have ended meanwhile (1094: unknown thread).
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err == nil {
			killed++
		}
	}
	return killed, nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
