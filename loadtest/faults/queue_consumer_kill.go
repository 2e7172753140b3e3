package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/loadtest"
)

// QueueConsumerKill crashes a replica (SIGKILL) in the middle of its queue
// consumer's batch (a run with --accept queue): orders answered 202, read
// from the stream, and being written. The fault holds the struck replica's
// consumer at a hook point of its first batch of the load's SKU and kills
// it there: before COMMIT on an odd seed (the transaction dies with the
// process, nothing is written), after the commit on an even one (written,
// not acknowledged). Nothing acknowledges those entries any more; another
// replica claims them once they have been pending for the claim bound (35 s
// by default) and writes each one once, or finds it written and only
// settles it (a redelivery). The run's lost_accepted, pending_left and
// duplicates say whether that held: a consumer that acknowledged its
// entries before writing them would lose the batch killed before COMMIT.
// The fault waits for the claim, so the run's checks follow the
// redelivery.
// The replica is started again at once, so the load goes on with every
// replica.
func QueueConsumerKill() loadtest.Fault {
	var hooks perRun[*insideHook]
	return loadtest.Fault{
		Prepare: func(ctx context.Context, run *loadtest.Run) (func(), error) {
			hook, err := startInsideHook()
			if err != nil {
				return nil, err
			}
			hookEveryReplica(run, hook)
			hooks.put(run, hook)
			return func() {
				hooks.drop(run)
				hook.Close()
			}, nil
		},
		Inject: func(ctx context.Context, run *loadtest.Run) error {
			if run.Spec.Accept != "queue" {
				notFired(run, errors.New("the run does not accept into a queue (--accept queue)"))
				return nil
			}
			hook, err := hooks.get(run)
			if err != nil {
				return err
			}
			r, _, err := replicas(run)
			if err != nil {
				notFired(run, err)
				return nil
			}
			q, err := openQueueWatch(ctx, run)
			if err != nil {
				return err
			}
			defer q.close()
			at, what := atBeforeCommit, "about to commit"
			if run.Spec.Seed%2 == 0 {
				at, what = atAfterCommit, "committed, not acknowledged"
			}
			caught := hook.expect(func(c *hookCall) bool {
				return c.At == at && c.Replica == r.Name && slices.Contains(run.SKUs, c.SKU)
			})
			// Its batch may come a little after the load's last 202.
			wait, cancel := context.WithTimeout(context.WithoutCancel(ctx), loadLimit(run)+lockWait)
			defer cancel()
			var c *hookCall
			select {
			case c = <-caught:
			case <-wait.Done():
				hook.forget(caught)
				notFired(run, fmt.Errorf("%s's consumer wrote no batch of the load's SKU", r.Name))
				return nil
			}
			ctx = context.WithoutCancel(ctx) // the kill and the restart happen even if the load is over
			t0 := time.Now()
			err = r.Kill()
			c.Answer()
			if err != nil {
				return fmt.Errorf("kill %s: %w", r.Name, err)
			}
			held := q.pendingIDs(ctx, r.Name)
			run.Fired("%s killed (SIGKILL) with its consumer's batch %s, %d queued orders read and not acknowledged", c, what, len(held))
			sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
			err = r.Start(sctx)
			scancel()
			if err != nil {
				return fmt.Errorf("restart %s: %w", r.Name, err)
			}
			run.Eventf("%s started again, ready %s after the kill", r.Name, since(t0))
			// A batch killed after its commit has its outcome in MySQL
			// already, so the drain would not wait for its redelivery:
			// wait here until its entries were claimed and settled.
			left := len(held)
			for left > 0 && time.Since(t0) < claimWait {
				if err := clock.Sleep(ctx, 100*time.Millisecond); err != nil {
					return err
				}
				all := q.pendingIDs(ctx, "")
				left = 0
				for _, id := range held {
					if slices.Contains(all, id) {
						left++
					}
				}
			}
			if left == 0 {
				run.Eventf("the entries %s held were claimed and settled %s after the kill", r.Name, since(t0))
			} else {
				run.Eventf("%d of the entries %s held still pending %s after the kill", left, r.Name, since(t0))
			}
			return nil
		},
	}
}

// claimWait bounds the wait for a dead consumer's entries to be claimed
// and settled: the replicas' claim bound (35 s by default), a claim
// period and the batch.
const claimWait = 60 * time.Second

// loadLimit is about how long the run's load lasts.
func loadLimit(run *loadtest.Run) time.Duration {
	if run.Spec.Rate <= 0 {
		return 10 * time.Second
	}
	return time.Duration(run.Spec.Requests)*time.Second/time.Duration(run.Spec.Rate) + 5*time.Second
}

// queueWatch reads the queue's pending entries on the gate's Redis, where
// orderd keeps the stream: oversold:{<database identity>:gate}:queue,
// group writers (inventory.Queue).
type queueWatch struct {
	rdb    redis.UniversalClient
	stream string
}

func openQueueWatch(ctx context.Context, run *loadtest.Run) (*queueWatch, error) {
	db, err := sql.Open("mysql", run.Servers.MySQLDSN)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var id string
	if err := db.QueryRowContext(ctx, "SELECT value FROM meta WHERE name = 'database_identity'").Scan(&id); err != nil {
		return nil, fmt.Errorf("database identity: %w", err)
	}
	rdb, err := redisconn.Open(run.Servers.RedisAddr)
	if err != nil {
		return nil, err
	}
	return &queueWatch{rdb: rdb, stream: "oversold:{" + id + ":gate}:queue"}, nil
}

// pending counts the entries pending to consumer (up to 1000; 0 when
// unreadable).
func (q *queueWatch) pending(ctx context.Context, consumer string) int {
	return len(q.pendingIDs(ctx, consumer))
}

// pendingIDs lists the entries pending to consumer, or to any consumer
// for "" (up to 1000; none when unreadable).
func (q *queueWatch) pendingIDs(ctx context.Context, consumer string) []string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ps, err := q.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: q.stream, Group: "writers", Start: "-", End: "+", Count: 1000, Consumer: consumer,
	}).Result()
	if err != nil {
		return nil
	}
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
	}
	return ids
}

// length is the number of entries in the stream: accepted orders not
// settled yet (0 when unreadable).
func (q *queueWatch) length(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	n, _ := q.rdb.XLen(ctx, q.stream).Result()
	return int(n)
}

// last is the id of the stream's newest entry ("" for none).
func (q *queueWatch) last(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ms, err := q.rdb.XRevRangeN(ctx, q.stream, "+", "-", 1).Result()
	if err != nil || len(ms) == 0 {
		return ""
	}
	return ms[0].ID
}

// upTo counts the entries with an id up to last: those already there
// when last was read, still there (-1 when unreadable).
func (q *queueWatch) upTo(ctx context.Context, last string) int {
	if last == "" {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ms, err := q.rdb.XRange(ctx, q.stream, "-", last).Result()
	if err != nil {
		return -1
	}
	return len(ms)
}

// pendingAll counts the entries read by any consumer and not settled (0
// when unreadable).
func (q *queueWatch) pendingAll(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	p, err := q.rdb.XPending(ctx, q.stream, "writers").Result()
	if err != nil {
		return 0
	}
	return int(p.Count)
}

func (q *queueWatch) close() { q.rdb.Close() }
