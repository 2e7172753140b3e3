package faults

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// QueueRedisRestart kills the accept queue's Redis (the gate's) with
// SIGKILL while accepted orders wait in its stream, and starts it again at
// once on the same port (a run with --accept queue). fsync false: the
// server has no persistence (no RDB, no AOF) and comes back empty; true:
// appendonly yes with appendfsync always, and it comes back with what it
// answered. The run gets a private Redis, so the lab's shared one is never
// disturbed.
//
// So that the restart lands while orders are queued and not yet written,
// the fault holds every replica's queue consumer at the hook before its
// first write of the load's SKUs (its batch read, nothing written), while
// the load goes on being answered 202: the stream fills. Once it holds
// half the run's stock in entries (or the load is over), every write to
// Redis is paused (CLIENT PAUSE WRITE) while the stream is counted, Redis
// is killed and restarted, and the consumers are let go. The run's
// lost_accepted is
// then what the restart lost: the entries no consumer had read (the held
// batches are written from the consumers' memory). Without persistence
// the counters are gone too: the next accept seeds them again from MySQL,
// before the held batches are written, so orders admitted beyond what
// MySQL then holds are rejected after their 202 by a guard that checks,
// and may be oversold by guard none. The fault says what was queued at
// the restart, and what the stream held after, in the run's events and
// notes.
func QueueRedisRestart(fsync bool) loadtest.Fault {
	type prepared struct {
		hook *insideHook
		srv  *testbed.Server
	}
	var runs perRun[prepared]
	setting := "without persistence"
	var args []string
	if fsync {
		setting = "with appendonly yes, appendfsync always"
		args = []string{"--appendonly", "yes", "--appendfsync", "always"}
	}
	return loadtest.Fault{
		Prepare: func(ctx context.Context, run *loadtest.Run) (func(), error) {
			hook, err := startInsideHook()
			if err != nil {
				return nil, err
			}
			hookEveryReplica(run, hook)
			srv, err := testbed.StartRedis(ctx, testbed.Options{Args: args})
			if err != nil {
				hook.Close()
				return nil, err
			}
			run.Servers.RedisAddr = srv.Addr
			runs.put(run, prepared{hook, srv})
			return func() {
				runs.drop(run)
				hook.Close()
				srv.Stop()
			}, nil
		},
		Inject: func(ctx context.Context, run *loadtest.Run) error {
			if run.Spec.Accept != "queue" {
				notFired(run, errors.New("the run does not accept into a queue (--accept queue)"))
				return nil
			}
			p, err := runs.get(run)
			if err != nil {
				return err
			}
			if run.Fleet == nil {
				notFired(run, errors.New("no replicas started by the lab"))
				return nil
			}
			q, err := openQueueWatch(ctx, run)
			if err != nil {
				return err
			}
			defer q.close()
			held := holdConsumers(ctx, run, p.hook, q, max(1, run.Spec.Stock/2))
			defer held.release()
			// The kill, the restart and what follows must happen even if
			// the load ends meanwhile.
			ctx = context.WithoutCancel(ctx)
			// Every write waits from here to the kill, accepts included, so
			// what is counted is what the kill strikes.
			if err := q.rdb.Do(ctx, "CLIENT", "PAUSE", 10_000, "WRITE").Err(); err != nil {
				return fmt.Errorf("pause the queue's writes: %w", err)
			}
			last := q.last(ctx)
			queued, pending := q.upTo(ctx, last), q.pendingAll(ctx)
			t0 := time.Now()
			if err := p.srv.Kill(); err != nil {
				return err
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = p.srv.Restart(rctx)
			cancel()
			if err != nil {
				return err
			}
			run.Disrupted("", t0)
			after := q.upTo(ctx, last) // the accepts since are not what it kept
			msg := "the queue's Redis killed (SIGKILL) and restarted %s in %s, with %d accepted orders not settled in its stream (%d unread, %d read by consumers: %s); it came back with %d of them"
			margs := []any{setting, since(t0), queued, queued - pending, pending, held, after}
			if queued > 0 {
				run.Fired(msg, margs...)
			} else {
				run.Eventf(msg, margs...)
			}
			held.release()
			if fsync {
				run.Notef("the queue's Redis restarted with appendonly yes, appendfsync always, %d accepted orders in its stream; it came back with %d of them, its pending list and its counters as they were, for the consumers to go on with", queued, after)
			} else {
				run.Notef("the queue's Redis restarted without persistence with %d accepted orders in its stream, %d of them unread: those are lost (lost_accepted; GET answers 404), the %d the consumers had read are written from their memory. "+
					"Its counters came back empty and the next accept seeded them from MySQL, usually before those %d were written, so until those settle and are taken from the new counters (their entries carry the lost counters' epoch), "+
					"the gate can admit up to that many more than MySQL holds: a guard that checks rejects those after their 202 (rejected_after_accept); one written before the seed read MySQL is taken twice, and the counter is short by it (undersold) until the reconciler; guard none, whose decrement has no condition, can oversell them instead. The stock the lost orders had taken is sold again, or, if the load is over, left unsold (undersold)", queued, queued-pending, pending, pending)
			}
			return nil
		},
	}
}

// heldConsumers are the queue consumers holdConsumers caught.
type heldConsumers struct {
	calls []*hookCall
}

func (h *heldConsumers) release() {
	for _, c := range h.calls {
		c.Answer()
	}
}

func (h *heldConsumers) String() string {
	if len(h.calls) == 0 {
		return "none held"
	}
	names := make([]string, len(h.calls))
	for i, c := range h.calls {
		names[i] = c.Replica
	}
	return fmt.Sprintf("%d held before their write on %v", len(h.calls), names)
}

// holdConsumers catches each replica's queue consumer at the hook before
// its first write of the load's SKUs and keeps it there (the caller
// releases them), until the stream holds at least entries, or the load
// (ctx) is over.
func holdConsumers(ctx context.Context, run *loadtest.Run, hook *insideHook, q *queueWatch, entries int) *heldConsumers {
	chans := make([]<-chan *hookCall, len(run.Fleet.Replicas))
	for i, r := range run.Fleet.Replicas {
		chans[i] = hook.expect(func(c *hookCall) bool {
			return c.At == atBeforeWrite && c.Replica == r.Name && slices.Contains(run.SKUs, c.SKU)
		})
	}
	h := &heldConsumers{}
	collect := func() {
		for i, ch := range chans {
			if ch == nil {
				continue
			}
			select {
			case c := <-ch:
				h.calls = append(h.calls, c)
				chans[i] = nil
			default:
			}
		}
	}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil && q.length(ctx) < entries {
		collect()
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	for _, ch := range chans {
		if ch != nil {
			hook.forget(ch)
		}
	}
	collect() // taken before forget
	return h
}
