package faults

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/oversold-lab/oversold/loadtest"
)

// Hook points, as orderd names them (order.HookPoint) in its fault hook's
// "at" parameter.
const (
	atAfterRead    = "after-read"    // lease held, stock read; work and the one Lost check next
	atBeforeWrite  = "before-write"  // lease held, stock read, Lost checked, nothing written
	atBeforeCommit = "before-commit" // guarded write and order insert sent, COMMIT next
	atBeforeCache  = "before-cache"  // committed; the cache update (step 7) next
	atAfterCommit  = "after-commit"  // committed and cached; release and reply next
	// The reservations' points.
	atHoldAfterCommit   = "hold-after-commit"   // a hold committed and cached; release and reply next
	atSettleBeforeWrite = "settle-before-write" // a confirm, cancel or expiry read held under its leases; its transaction next
)

// hookCall is one call of a replica's fault hook (OVERSOLD_FAULT_HOOK): the
// replica waits at that point of its order flow until the call is answered.
type hookCall struct {
	At      string
	Replica string // OVERSOLD_INSTANCE: r1, r2, ...
	SKU     string
	Token   uint64
	Key     string // the order's Idempotency-Key
	// Reservation and Op at the reservation hook points: its id, and
	// hold, confirm, cancel or expire.
	Reservation string
	Op          string
	Arrived     time.Time

	answer chan struct{}
	once   sync.Once
}

// Answer lets the replica go on. It is safe to call more than once.
func (c *hookCall) Answer() { c.once.Do(func() { close(c.answer) }) }

func (c *hookCall) String() string {
	return fmt.Sprintf("%s at %s on %s (token %d)", c.Replica, c.At, c.SKU, c.Token)
}

// insideHook is the lab's end of orderd's fault hook for the server and
// network faults: it tells a fault exactly when a replica is inside its
// critical section, holding a lease, and can keep it there (not paused:
// its watchdog and session go on) while the fault works on a server or a
// path. Calls no fault is waiting for are answered at once.
type insideHook struct {
	URL string

	srv     *http.Server
	closing chan struct{}
	served  chan struct{}

	mu      sync.Mutex
	waiters []*waiter // see expect
}

// waiter is a call a fault expects: the first call match accepts is handed
// to ch and waits for the fault, whatever else the fault is doing.
type waiter struct {
	match func(*hookCall) bool
	ch    chan *hookCall
}

// startInsideHook serves the hook on a free loopback port.
func startInsideHook() (*insideHook, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fault hook: %w", err)
	}
	h := &insideHook{
		URL:     "http://" + ln.Addr().String() + "/inside",
		closing: make(chan struct{}),
		served:  make(chan struct{}),
	}
	h.srv = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(h.served)
		_ = h.srv.Serve(ln)
	}()
	return h, nil
}

func (h *insideHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	token, _ := strconv.ParseUint(q.Get("token"), 10, 64)
	c := &hookCall{
		At: q.Get("at"), Replica: q.Get("replica"), SKU: q.Get("sku"), Token: token, Key: q.Get("key"),
		Reservation: q.Get("reservation"), Op: q.Get("op"),
		Arrived: time.Now(), answer: make(chan struct{}),
	}
	if c.At == "" {
		c.At = atBeforeWrite
	}
	if x := h.expected(c); x != nil {
		x.ch <- c // buffered: one call per waiter
		select {
		case <-c.answer:
		case <-h.closing:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.WriteHeader(http.StatusNoContent) // no fault waiting: go on at once
}

// expect registers the first call match will accept, from now on: that call
// is delivered on the channel and waits there until the fault answers it.
// Nothing can slip past it, so a fault that registers before it sends its
// own order always catches that order. Each waiter takes one call.
func (h *insideHook) expect(match func(*hookCall) bool) <-chan *hookCall {
	x := &waiter{match: match, ch: make(chan *hookCall, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waiters = append(h.waiters, x)
	return x.ch
}

// forget removes the waiter of ch, if no call took it yet: a fault that
// gave up on a call must not hold a later one.
func (h *insideHook) forget(ch <-chan *hookCall) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, x := range h.waiters {
		if x.ch == ch {
			h.waiters = append(h.waiters[:i], h.waiters[i+1:]...)
			return
		}
	}
}

// expected removes and returns the first waiter that accepts c, if any.
func (h *insideHook) expected(c *hookCall) *waiter {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, x := range h.waiters {
		if x.match(c) {
			h.waiters = append(h.waiters[:i], h.waiters[i+1:]...)
			return x
		}
	}
	return nil
}

// Close answers every waiting call and stops serving.
func (h *insideHook) Close() {
	close(h.closing)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.srv.Shutdown(ctx)
	<-h.served
}

// hookEveryReplica points every replica of run at h. Each replica calls it
// at every hook point of every order; a call nobody waits for costs one
// loopback round trip.
func hookEveryReplica(run *loadtest.Run, h *insideHook) {
	for i := range run.ReplicaEnv {
		hookReplica(run, i, h)
	}
}

// hookReplica points replica i only at h.
func hookReplica(run *loadtest.Run, i int, h *insideHook) {
	if run.ReplicaEnv[i] == nil {
		run.ReplicaEnv[i] = map[string]string{}
	}
	run.ReplicaEnv[i]["OVERSOLD_FAULT_HOOK"] = h.URL
}

// perRun keeps what a fault's Prepare made for its Inject, by run (a Fault
// value is shared by every run of a lab).
type perRun[T any] struct {
	mu sync.Mutex
	m  map[*loadtest.Run]T
}

func (p *perRun[T]) put(run *loadtest.Run, v T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[*loadtest.Run]T{}
	}
	p.m[run] = v
}

func (p *perRun[T]) get(run *loadtest.Run) (T, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.m[run]
	if !ok {
		return v, errors.New("fault not prepared for this run")
	}
	return v, nil
}

func (p *perRun[T]) drop(run *loadtest.Run) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, run)
}

// ttl is the run's lease TTL (orderd's default when the spec leaves it 0).
func ttl(run *loadtest.Run) time.Duration {
	if run.Spec.LockTTL > 0 {
		return run.Spec.LockTTL
	}
	return 10 * time.Second
}
