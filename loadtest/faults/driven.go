package faults

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/loadtest"
)

// The scenarios drive the orders that meet the fault themselves, on the
// run's fault SKU (Run.FaultSKU), which the load never touches: the load
// may sell its SKUs out, or never send the struck replica an order in time,
// but the fault's own orders are always there. So every run injects its
// fault, every time, and a run where it could not says so ("fault did not
// fire", Run.Fired never called).

// faultLimit bounds a fault's own orders, which may outlive the load (the
// run waits for Inject to return before it checks anything).
const faultLimit = time.Minute

// lockWait is orderd's default lock wait (order.DefaultLockWait): how long a
// driven order may queue for the lock before it gets a 503.
const lockWait = 5 * time.Second

// driver places the fault's own orders (quantity 1, on the fault SKU),
// catches them at the run's hook, and accounts for what they got.
type driver struct {
	run    *loadtest.Run
	hook   *insideHook
	client *http.Client
	cancel context.CancelFunc
	ctx    context.Context
	later  []*sent // waited for by close: enterBatch's other orders
}

// drive returns a driver for run's own orders and the context they go on
// with: it does not end with the load, only after faultLimit or close.
func drive(ctx context.Context, run *loadtest.Run, hook *insideHook) (context.Context, *driver) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), faultLimit)
	return ctx, &driver{run: run, hook: hook, client: &http.Client{Timeout: 30 * time.Second}, cancel: cancel, ctx: ctx}
}

// scenario is a fault whose preamble lives in fault, so that a scenario
// states only its own story: what Prepare starts for a run (private
// servers, proxies, replica settings) and what Inject does with it. Every
// run gets a hook of its own, every replica pointed at it; Inject gets what
// Prepare made, the run's driver and the replicas it strikes.
type scenario[T any] struct {
	Backends []string // nil: all
	Workload string
	// Prepare runs once every replica is pointed at the run's hook (its
	// ReplicaEnv maps exist). It returns what Inject gets and the cleanup
	// that undoes it, and cleans up itself when it fails. nil: nothing
	// beyond the hook.
	Prepare func(ctx context.Context, run *loadtest.Run) (T, func(), error)
	// Replicas picks the replica struck and the next one; nil is the one
	// the seed draws (replicas).
	Replicas func(run *loadtest.Run) (r, next *loadtest.Replica, err error)
	// AfterLoad holds Inject until the load is over; its driver's
	// faultLimit starts then.
	AfterLoad bool
	Inject    func(ctx context.Context, run *loadtest.Run, d *driver, st T, r, next *loadtest.Replica) error
}

// fault is the scenario as the lab runs it.
func (s scenario[T]) fault() loadtest.Fault {
	type prepared struct {
		hook *insideHook
		st   T
	}
	var runs perRun[prepared]
	pick := s.Replicas
	if pick == nil {
		pick = replicas
	}
	return loadtest.Fault{
		Backends: s.Backends,
		Workload: s.Workload,
		Prepare: func(ctx context.Context, run *loadtest.Run) (func(), error) {
			hook, err := startInsideHook()
			if err != nil {
				return nil, err
			}
			hookEveryReplica(run, hook)
			var st T
			cleanup := func() {}
			if s.Prepare != nil {
				if st, cleanup, err = s.Prepare(ctx, run); err != nil {
					hook.Close()
					return nil, err
				}
			}
			runs.put(run, prepared{hook, st})
			return func() {
				runs.drop(run)
				hook.Close()
				cleanup()
			}, nil
		},
		Inject: func(ctx context.Context, run *loadtest.Run) error {
			p, err := runs.get(run)
			if err != nil {
				return err
			}
			r, next, err := pick(run)
			if err != nil {
				return err
			}
			if s.AfterLoad {
				<-ctx.Done()
			}
			ctx, d := drive(ctx, run, p.hook)
			defer d.close()
			return s.Inject(ctx, run, d, p.st, r, next)
		},
	}
}

// drivenFault is a scenario that needs only the hook: inject gets the
// run's driver, the replica the seed draws and the next one.
func drivenFault(inject func(ctx context.Context, run *loadtest.Run, d *driver, r, next *loadtest.Replica) error) loadtest.Fault {
	return scenario[struct{}]{
		Inject: func(ctx context.Context, run *loadtest.Run, d *driver, _ struct{}, r, next *loadtest.Replica) error {
			return inject(ctx, run, d, r, next)
		},
	}.fault()
}

// close waits for the orders left to it (their answers are the run's: an
// acknowledged one is checked), then ends the driver's context.
func (d *driver) close() {
	for _, s := range d.later {
		d.wait(d.ctx, s, faultLimit/2)
	}
	d.cancel()
	d.client.CloseIdleConnections()
}

// sent is one driven order on its way.
type sent struct {
	Key     string
	Replica string
	done    chan placed
	got     *placed
}

// send places an order with Idempotency-Key run.KeyPrefix+"-"+name on
// replica r, in the background.
func (d *driver) send(ctx context.Context, r *loadtest.Replica, name string) *sent {
	s := &sent{Key: d.run.KeyPrefix + "-" + name, Replica: r.Name, done: make(chan placed, 1)}
	go func() { s.done <- place(ctx, d.client, r.URL, d.run.FaultSKU, s.Key) }()
	return s
}

// wait returns the order's answer (status 0 when it got none within limit),
// adds an acknowledged order to what the invariant check expects, and says
// what it got in the run's events.
func (d *driver) wait(ctx context.Context, s *sent, limit time.Duration) placed {
	if s.got != nil {
		return *s.got
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	var p placed
	select {
	case p = <-s.done:
		s.got = &p
	case <-t.C:
		p = placed{err: fmt.Errorf("no answer within %s", limit)}
	case <-ctx.Done():
		p = placed{err: ctx.Err()}
	}
	switch {
	case p.status == http.StatusCreated || p.status == http.StatusOK:
		d.run.Acked(p.id)
		d.run.Eventf("order %s on %s answered %d (order %s)", s.Key, s.Replica, p.status, p.id)
	case p.status == http.StatusAccepted: // accept queue: the drain checks it is written
		d.run.AcceptedQueued(p.id)
		d.run.Eventf("order %s on %s answered 202 (order %s, pending)", s.Key, s.Replica, p.id)
	case p.status != 0:
		d.run.Eventf("order %s on %s answered %d %s", s.Key, s.Replica, p.status, p.code)
	default:
		d.run.Eventf("order %s on %s got no answer: %v", s.Key, s.Replica, p.err)
	}
	return p
}

// catch waits up to limit for the hook call ch delivers, or for s to be
// answered first (it never reached the hook point: out of stock, a lock
// timeout). The caller must Answer the call it gets.
func catch(ctx context.Context, ch <-chan *hookCall, s *sent, limit time.Duration) (*hookCall, error) {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case c := <-ch:
		return c, nil
	case p := <-s.done:
		s.done <- p // for wait, which accounts for the answer
		if p.err != nil {
			return nil, fmt.Errorf("order %s on %s got no answer before the hook: %w", s.Key, s.Replica, p.err)
		}
		return nil, fmt.Errorf("order %s on %s answered %d %s before reaching the hook", s.Key, s.Replica, p.status, p.code)
	case <-t.C:
		return nil, fmt.Errorf("order %s on %s did not reach the hook within %s", s.Key, s.Replica, limit)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// sendCaught sends order name to replica r and waits up to limit for it
// at hook point, where it stays until the caller Answers the call.
func (d *driver) sendCaught(ctx context.Context, r *loadtest.Replica, point, name string, limit time.Duration) (*hookCall, *sent, error) {
	caught := d.hook.expect(byKey(point, d.run.KeyPrefix+"-"+name))
	s := d.send(ctx, r, name)
	c, err := catch(ctx, caught, s, limit)
	return c, s, err
}

// enter is the order that meets the fault: sent to replica r and caught at
// hook point, inside its critical section. An order answered before it got
// there (a lock timeout, say) leaves the fault nothing to strike: enter
// says so in the run's events, waits for the answer and returns a nil call.
func (d *driver) enter(ctx context.Context, r *loadtest.Replica, point, name string) (*hookCall, *sent) {
	c, s, err := d.sendCaught(ctx, r, point, name, 2*lockWait)
	if err != nil {
		notFired(d.run, err)
		d.wait(ctx, s, lockWait)
		return nil, s
	}
	return c, s
}

// batchOrders is how many of the fault's own orders the struck critical
// section sells under enterBatch: coalescing on (OVERSOLD_BATCH_MAX > 1),
// the fault strikes a batch, not a lone order.
const batchOrders = 4

// queueSettle is how long enterBatch gives its queued orders to reach the
// replica before the holder in front of them lets go. One arriving later
// is sold in a batch of its own after the struck one; the replicas' write
// records (orders per write) show what each batch held.
const queueSettle = 200 * time.Millisecond

// enterBatch is enter for a coalesced batch on replica r: a first order
// ("name-front") is held inside its critical section at before-write while
// name and batchOrders-1 more (name-2, name-3, ...) queue behind it on r;
// let go, it leaves them to be sold together, one acquisition and one
// transaction, and that batch is caught at hook point. The call is the
// batch's (the hook names its first order), at is that order and batch
// every order sent for it (name's first). d.close waits for the front
// order and for every order of batch not waited for, so each answer is
// accounted. A nil call means the fault found nothing to strike, as enter.
//
// Under lock none no lock holds the queue behind the front order: the
// batch could join the front's own write, so the batch is sent alone and
// whichever of its orders reaches point first is caught.
func (d *driver) enterBatch(ctx context.Context, r *loadtest.Replica, point, name string) (c *hookCall, at *sent, batch []*sent) {
	var front *hookCall
	if d.run.Spec.Backend != "none" {
		var fs *sent
		var err error
		front, fs, err = d.sendCaught(ctx, r, atBeforeWrite, name+"-front", 2*lockWait)
		d.later = append(d.later, fs)
		if err != nil {
			notFired(d.run, err)
			return nil, nil, nil
		}
	}
	keys := map[string]bool{}
	for i := range batchOrders {
		n := name
		if i > 0 {
			n = fmt.Sprintf("%s-%d", name, i+1)
		}
		keys[d.run.KeyPrefix+"-"+n] = true
	}
	caught := d.hook.expect(func(c *hookCall) bool {
		return c.At == point && c.Replica == r.Name && c.SKU == d.run.FaultSKU && keys[c.Key]
	})
	for i := range batchOrders {
		n := name
		if i > 0 {
			n = fmt.Sprintf("%s-%d", name, i+1)
		}
		batch = append(batch, d.send(ctx, r, n))
	}
	d.later = append(d.later, batch...)
	var err error
	if front != nil {
		err = clock.Sleep(ctx, queueSettle)
		front.Answer()
	}
	if err == nil {
		c, err = catch(ctx, caught, batch[0], 2*lockWait)
	}
	if err != nil {
		notFired(d.run, err)
		return nil, nil, batch
	}
	at = batch[0]
	for _, s := range batch {
		if s.Key == c.Key {
			at = s
		}
	}
	return c, at, batch
}

// enterQueued is enterBatch for accept queue: name and batchOrders-1 more
// orders are sent to replica r and answered 202 at once; whichever
// replica's consumer reads them writes them later, and the first write of
// the fault's SKU to reach point after they were sent, on any replica, is
// caught. It may hold an earlier round's order first (the hook names a
// batch by its first order), which the fault's 202s need written all the
// same. d.close waits for every order's 202, which the run's drain then
// follows to its outcome. A nil call means no write reached point in
// time, as enter.
func (d *driver) enterQueued(ctx context.Context, r *loadtest.Replica, point, name string) (c *hookCall, batch []*sent) {
	names := make([]string, batchOrders)
	for i := range batchOrders {
		names[i] = name
		if i > 0 {
			names[i] = fmt.Sprintf("%s-%d", name, i+1)
		}
	}
	caught := d.hook.expect(func(c *hookCall) bool { return c.At == point && c.SKU == d.run.FaultSKU })
	for _, n := range names {
		batch = append(batch, d.send(ctx, r, n))
	}
	d.later = append(d.later, batch...)
	// The 202s come first: only a consumer's write reaches point.
	t := time.NewTimer(2 * lockWait)
	defer t.Stop()
	select {
	case c = <-caught:
		return c, batch
	case <-t.C:
		notFired(d.run, fmt.Errorf("no consumer wrote the orders %s.. sent to %s within %s", name, r.Name, 2*lockWait))
	case <-ctx.Done():
		notFired(d.run, ctx.Err())
	}
	d.hook.forget(caught)
	select { // taken meanwhile: let it go
	case c := <-caught:
		c.Answer()
	default:
	}
	return nil, batch
}

// byKey matches the call of the order with key at hook point point.
func byKey(point, key string) func(*hookCall) bool {
	return func(c *hookCall) bool { return c.At == point && c.Key == key }
}

// replicas returns the replica the run's seed draws as the one struck and
// the next one, which sends the second holder's order.
func replicas(run *loadtest.Run) (struck, other *loadtest.Replica, err error) {
	if run.Fleet == nil || len(run.Fleet.Replicas) < 2 {
		return nil, nil, errors.New("the fault needs at least two replicas started by the lab")
	}
	rs := run.Fleet.Replicas
	i := run.Rand.IntN(len(rs))
	return rs[i], rs[(i+1)%len(rs)], nil
}

// replica returns replica i (r1 is 0) of the run.
func replica(run *loadtest.Run, i int) (*loadtest.Replica, error) {
	if run.Fleet == nil || len(run.Fleet.Replicas) <= i {
		return nil, fmt.Errorf("the fault needs replica r%d started by the lab", i+1)
	}
	return run.Fleet.Replicas[i], nil
}

// victimPair returns the victim (r1), the replica the network faults
// disturb, and the next one.
func victimPair(run *loadtest.Run) (r, next *loadtest.Replica, err error) {
	if r, err = replica(run, victim); err != nil {
		return nil, nil, err
	}
	if next, err = replica(run, victim+1); err != nil {
		return nil, nil, err
	}
	return r, next, nil
}

// oneReplica returns the replica the seed draws, for a fault that needs
// no other.
func oneReplica(run *loadtest.Run) (r, next *loadtest.Replica, err error) {
	if run.Fleet == nil || len(run.Fleet.Replicas) == 0 {
		return nil, nil, errors.New("no replicas started by the lab")
	}
	return run.Fleet.Replicas[run.Rand.IntN(len(run.Fleet.Replicas))], nil, nil
}

// notFired says in the run's events why the fault did not strike.
func notFired(run *loadtest.Run, err error) {
	run.Eventf("nothing injected: %v", err)
}
