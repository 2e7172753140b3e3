package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/loadtest"
)

// QueueConsumerKill crashes a replica (SIGKILL) while its queue consumer
// holds entries it read and has not settled (a run with --accept queue):
// orders answered 202, in a batch being written or just committed. Nothing
// acknowledges them any more; another replica claims them once they have
// been pending for the claim bound (35 s by default) and writes each one
// once, or finds it written and only settles it. The run's lost_accepted,
// pending_left and duplicates say whether that held. The fault watches the
// struck replica's pending entries and kills it the moment it has some;
// it fires when some are still pending to it after the kill. The replica
// is started again at once, so the load goes on with every replica.
func QueueConsumerKill() loadtest.Fault {
	return loadtest.Fault{
		Inject: func(ctx context.Context, run *loadtest.Run) error {
			if run.Spec.Accept != "queue" {
				notFired(run, errors.New("the run does not accept into a queue (--accept queue)"))
				return nil
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
			for ctx.Err() == nil {
				if q.pending(ctx, r.Name) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				t0 := time.Now()
				if err := r.Kill(); err != nil {
					return fmt.Errorf("kill %s: %w", r.Name, err)
				}
				left := q.pending(context.WithoutCancel(ctx), r.Name)
				if left > 0 {
					run.Fired("%s killed (SIGKILL) with %d queued orders read and not settled", r.Name, left)
				} else {
					run.Eventf("%s killed (SIGKILL), but it had settled its entries first: again", r.Name)
				}
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				err := r.Start(sctx)
				cancel()
				if err != nil {
					return fmt.Errorf("restart %s: %w", r.Name, err)
				}
				run.Eventf("%s started again, ready %s after the kill", r.Name, since(t0))
				if left > 0 {
					return nil
				}
			}
			return nil
		},
	}
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
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ps, err := q.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: q.stream, Group: "writers", Start: "-", End: "+", Count: 1000, Consumer: consumer,
	}).Result()
	if err != nil {
		return 0
	}
	return len(ps)
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
