// Package locktest is the one conformance suite every lock backend passes.
//
// A backend's test file only wires it up: it gives the suite the one
// function that opens its Locker from a config of its own, and a config.
//
//	type config struct{ Addr string; TTL time.Duration }
//
//	func open(ctx context.Context, c config) (locking.Locker, error) { ... }
//
//	func TestMain(m *testing.M) { locktest.Main(m, open) }
//
//	func TestConformance(t *testing.T) {
//		locktest.Run(t, locktest.Backend[config]{Name: "redis", Config: config{testbed.Redis(t), time.Second}, TTL: time.Second, ...})
//	}
//
// The suite opens every Locker with that function, in the test process and
// in helper processes (the test binary started again, which Main serves
// with the same function and the config sent as JSON), so the claims it
// checks hold across OS processes, not only goroutines, and a backend needs
// nothing but its own package to run them.
package locktest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
)

// Backend describes the backend under test. C is the config its open
// function (given to Main) takes: plain data, as it travels to helper
// processes as JSON.
type Backend[C any] struct {
	// Name labels the backend in logs.
	Name string
	// Config opens the backend, here and in helper processes.
	Config C
	// TTL is the lease TTL Config sets (not needed when InProcess).
	TTL time.Duration
	// InProcess marks a lock that is exclusive only within one process
	// (local): the cross-process, expiry and theft checks do not apply.
	InProcess bool
	// TakeOver puts another owner's claim in place of the holder's on key
	// (its value, node, key or row), as a holder granted after a pause
	// would be, for longer than the test runs. drop removes that claim.
	TakeOver func(ctx context.Context, key string) (drop func(context.Context) error, err error)
	// QueueConfig, if set, is Config with the waiters' fallback timers
	// turned off, so only a wake-up can end a wait: the queue test runs
	// with it.
	QueueConfig *C
	// Leftovers counts what the server holds for key (keys, znodes, rows).
	Leftovers func(ctx context.Context, key string) (int, error)
	// Expiry bounds how long a dead holder's lock takes to free; 0 = the TTL.
	Expiry time.Duration
	// State, if set, describes what the server holds overall (database
	// size, nodes under the root), for the ManyKeys report.
	State func(ctx context.Context) (string, error)
	// Footprint, if set, counts what the server holds for this process
	// beside the lock keys themselves (connections, watches, sessions or
	// leases, empty key parents). ManyKeys requires every count to come
	// back to its level before the run: anything kept per key ever used
	// grows with the keys.
	Footprint func(ctx context.Context) (map[string]int, error)
	// Servers and Through, if set, let the suite put a proxy in front of
	// each server: Servers are their addresses (host:port) as Config
	// names them, Through is Config naming addrs, one per server, instead.
	Servers []string
	Through func(addrs []string) C
}

func (b Backend[C]) ttl() time.Duration { return b.TTL }

func (b Backend[C]) expiry() time.Duration {
	if b.Expiry > 0 {
		return b.Expiry
	}
	return b.ttl()
}

// opener is the open function given to Main, a
// func(context.Context, C) (locking.Locker, error). Main sets it once,
// before any test runs.
var opener any

// Main is the TestMain of a backend package: open is how the suite opens
// the backend's Lockers, in this process and in helper processes. Main
// serves a helper-process request, or else runs the tests and stops the
// shared servers.
func Main[C any](m *testing.M, open func(ctx context.Context, cfg C) (locking.Locker, error)) {
	opener = open
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(child(spec, open))
	}
	testbed.Main(m)
}

// openConfig opens a Locker from cfg as a helper process would: with the
// function given to Main, after a JSON round trip of cfg.
func openConfig[C any](ctx context.Context, cfg C) (locking.Locker, error) {
	open, ok := opener.(func(context.Context, C) (locking.Locker, error))
	if !ok {
		return nil, fmt.Errorf("locktest: TestMain must call locktest.Main(m, open) with an open taking a %T", cfg)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("locktest: the config travels to helper processes as JSON: %w", err)
	}
	var sent C
	if err := json.Unmarshal(raw, &sent); err != nil {
		return nil, fmt.Errorf("locktest: the config travels to helper processes as JSON: %w", err)
	}
	return open(ctx, sent)
}

// Run checks every promise of the locking contract against b.
func Run[C any](t *testing.T, b Backend[C]) {
	t.Helper()
	if !b.InProcess && b.TTL <= 0 {
		t.Fatal("locktest: Backend.TTL must be the lease TTL its Config sets")
	}
	// Goroutines alive now (servers, shared clients) are not the backend's.
	ignore := append(testbed.GoleakOptions(), goleak.IgnoreCurrent())
	t.Cleanup(func() { goleak.VerifyNone(t, ignore...) })
	prefix := testbed.Prefix(t)

	t.Run("MutualExclusionGoroutines", func(t *testing.T) {
		l := open(t, b)
		hammer(t, []locking.Locker{l}, prefix+"/mx-goroutines", 16, 8)
	})
	t.Run("MutualExclusionLockers", func(t *testing.T) {
		if b.InProcess {
			t.Skip("two in-process lockers are two separate locks, by design: that is how replicas oversell")
		}
		hammer(t, pair(t, b), prefix+"/mx-lockers", 8, 8)
	})
	t.Run("MutualExclusionProcesses", func(t *testing.T) {
		if b.InProcess {
			t.Skip("an in-process lock is not exclusive across processes, by design")
		}
		exclusiveAcrossProcesses(t, b, prefix+"/mx-processes")
	})
	t.Run("ReleaseByOwnerOnly", func(t *testing.T) { releaseByOwnerOnly(t, b, prefix+"/owner") })
	t.Run("LostWhenTakenOver", func(t *testing.T) {
		if b.TakeOver == nil {
			t.Skip("this backend's leases cannot be taken over")
		}
		lostWhenTakenOver(t, b, prefix+"/takeover")
	})
	t.Run("ClosedLockerRefuses", func(t *testing.T) { closedRefuses(t, b, prefix+"/closed") })
	t.Run("WaitDeadline", func(t *testing.T) { waitDeadline(t, b, prefix+"/deadline") })
	t.Run("TokensIncrease", func(t *testing.T) { tokensIncrease(t, b, prefix+"/tokens") })
	t.Run("RenewalKeepsLease", func(t *testing.T) {
		if b.InProcess {
			t.Skip("an in-process lock has no lease to renew")
		}
		renewalKeepsLease(t, b, prefix+"/renewal")
	})
	t.Run("KilledHolderFrees", func(t *testing.T) {
		if b.InProcess {
			t.Skip("an in-process lock dies with its process")
		}
		killedHolderFrees(t, b, prefix+"/killed")
	})
	t.Run("ManyKeys", func(t *testing.T) { manyKeys(t, b, prefix+"/many") })
	t.Run("LostWhenHolderPaused", func(t *testing.T) {
		if b.InProcess {
			t.Skip("an in-process lock has no lease to lose")
		}
		lostWhenPaused(t, b, prefix+"/paused")
	})
	t.Run("LostWhenRenewalsDelayed", func(t *testing.T) {
		if b.Through == nil {
			t.Skip("this backend's servers are not proxied in its tests")
		}
		lostWhenDelayed(t, b, prefix+"/delayed")
	})
	t.Run("CancelledWaiterMidQueue", func(t *testing.T) {
		if b.QueueConfig == nil {
			t.Skip("this backend has no queue of waiters to wake")
		}
		cancelledWaiterMidQueue(t, b, prefix+"/midqueue")
	})
}

// pair returns two Lockers with separate clients, or for an in-process
// backend one Locker twice (two would not exclude each other).
func pair[C any](t *testing.T, b Backend[C]) []locking.Locker {
	first := open(t, b)
	if b.InProcess {
		return []locking.Locker{first, first}
	}
	return []locking.Locker{first, open(t, b)}
}

// open opens a Locker with its own clients, closed when the test ends.
func open[C any](t *testing.T, b Backend[C]) locking.Locker {
	t.Helper()
	l, err := openConfig(t.Context(), b.Config)
	if err != nil {
		t.Fatalf("open %s: %v", b.Name, err)
	}
	l = breakLocker(l)
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close %s: %v", b.Name, err)
		}
	})
	return l
}

func release(t *testing.T, lease locking.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lease.Release(ctx); err != nil {
		t.Errorf("release %q: %v", lease.Key(), err)
	}
}

// hammer releases workers spread over lockers at once on one key and
// checks that no two are ever inside together, that no update made inside
// is lost, and that each holder's token exceeds the previous holder's.
func hammer(t *testing.T, lockers []locking.Locker, key string, workers, rounds int) {
	var (
		start     = make(chan struct{})
		wg        sync.WaitGroup
		inside    atomic.Int32
		counter   atomic.Int64 // read, then written: a lost update shows overlap
		done      atomic.Int64 // increments made (a failed Acquire makes none)
		lastToken atomic.Uint64
		overlaps  atomic.Int32
		noToken   atomic.Bool
	)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := lockers[w%len(lockers)]
			<-start
			for range rounds {
				lease, err := l.Acquire(ctx, key)
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				select {
				case <-lease.Lost():
					t.Errorf("Lost closed on a lease just granted and held")
				default:
				}
				if tok := lease.Token(); tok == 0 {
					noToken.Store(true)
				} else if prev := lastToken.Swap(tok); tok <= prev {
					t.Errorf("token %d granted after %d", tok, prev)
				}
				v := counter.Load()
				time.Sleep(100 * time.Microsecond)
				counter.Store(v + 1)
				done.Add(1)
				select {
				case <-lease.Lost():
					t.Errorf("Lost closed on a held lease")
				default:
				}
				inside.Add(-1)
				rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
				err = lease.Release(rctx)
				rcancel()
				if err != nil {
					t.Errorf("release: %v", err)
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d times two holders were inside at once", n)
	}
	if got, want := counter.Load(), done.Load(); got != want {
		t.Errorf("counter = %d after %d exclusive increments: updates were lost", got, want)
	}
	if noToken.Load() && lastToken.Load() != 0 {
		t.Errorf("some grants had a token and some had none")
	}
}

func releaseByOwnerOnly[C any](t *testing.T, b Backend[C], key string) {
	lockers := pair(t, b)
	a, c := lockers[0], lockers[1]
	first, err := a.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	release(t, first)
	if err := first.Release(t.Context()); !errors.Is(err, locking.ErrNotHeld) {
		t.Fatalf("second release = %v, want ErrNotHeld", err)
	}
	second, err := c.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	// The first holder's stale release must not free the second's lock.
	if err := first.Release(t.Context()); !errors.Is(err, locking.ErrNotHeld) {
		t.Fatalf("stale release = %v, want ErrNotHeld", err)
	}
	if !refused(t, a, key, 300*time.Millisecond) {
		t.Error("the lock was granted while its holder still held it: a stale release freed it")
	}
	release(t, second)
}

// refused reports whether l's Acquire of key, with ctx ending after d,
// is refused. A grant is released at once. An Acquire that is still waiting
// 2s after its ctx ended fails the test, and is left to end when the key is
// freed.
func refused(t *testing.T, l locking.Locker, key string, d time.Duration) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), d)
	done := make(chan error, 1)
	go func() {
		defer cancel()
		lease, err := l.Acquire(ctx, key)
		if err == nil {
			rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
			lease.Release(rctx)
			rcancel()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err != nil
	case <-time.After(d + 2*time.Second):
		t.Errorf("Acquire still waiting 2s after its %v ctx ended", d)
		return true
	}
}

func waitDeadline[C any](t *testing.T, b Backend[C], key string) {
	lockers := pair(t, b)
	holder, waiter := lockers[0], lockers[1]
	held, err := holder.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	const wait = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	began := time.Now()
	type result struct {
		lease locking.Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		lease, err := waiter.Acquire(ctx, key)
		done <- result{lease, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(wait + 2*time.Second):
		// A wait that ignores ctx: free the lock so it can end.
		release(t, held)
		if r := <-done; r.err == nil {
			release(t, r.lease)
		}
		t.Fatalf("Acquire still waiting %v after its %v deadline", time.Since(began), wait)
	}
	took := time.Since(began)
	lease, err := r.lease, r.err
	if err == nil {
		release(t, lease)
		t.Fatal("acquired a held lock")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait ended with %v, want an error wrapping context.DeadlineExceeded", err)
	}
	if took > wait+2*time.Second {
		t.Errorf("the wait ended %v after a %v deadline", took, wait)
	}
	if b.Leftovers != nil {
		if n := leftovers(t, b, key, 1); n != 1 {
			t.Errorf("while one lease is held, %d objects exist for the key; the cancelled waiter left some behind", n)
		}
	}
	release(t, held)
	if b.Leftovers != nil {
		if n := leftovers(t, b, key, 0); n != 0 {
			t.Errorf("%d objects remain for the key after release", n)
		}
	}
}

// leftovers counts what the server holds for key, waiting up to 5s for the
// count to reach want: a cancelled wait may clean up in the background
// after Acquire returned (a Redlock waiter's leave goes to each node once
// the attempt's own request there has ended: under -race, with other
// packages' tests beside it, 2s was once not enough in CI).
func leftovers[C any](t *testing.T, b Backend[C], key string, want int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := b.Leftovers(ctx, key)
		if err != nil {
			t.Fatalf("count leftovers: %v", err)
		}
		if n == want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// closedRefuses checks that a closed Locker's Acquire fails rather than
// hand out a lease nobody renews.
func closedRefuses[C any](t *testing.T, b Backend[C], key string) {
	l, err := openConfig(t.Context(), b.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if lease, err := l.Acquire(ctx, key); err == nil {
		release(t, lease)
		t.Fatal("a closed Locker granted a lease")
	}
}

func tokensIncrease[C any](t *testing.T, b Backend[C], key string) {
	lockers := pair(t, b)
	var first, last uint64
	for i := range 6 {
		lease, err := lockers[i%2].Acquire(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		tok := lease.Token()
		release(t, lease)
		switch {
		case i == 0:
			first = tok
		case first == 0 && tok != 0:
			t.Fatalf("grant %d has token %d after a first grant without one", i, tok)
		case first != 0 && tok <= last:
			t.Fatalf("grant %d has token %d, not above the previous %d", i, tok, last)
		}
		last = tok // a backend without tokens says so with zero, every time
	}
}

func renewalKeepsLease[C any](t *testing.T, b Backend[C], key string) {
	lockers := pair(t, b)
	holder, rival := lockers[0], lockers[1]
	lease, err := holder.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	hold := 3 * b.ttl()
	ctx, cancel := context.WithTimeout(t.Context(), hold)
	defer cancel()
	if stolen, err := rival.Acquire(ctx, key); err == nil {
		release(t, stolen)
		t.Fatalf("a rival acquired the lock while it was held for %v (renewal failed)", hold)
	}
	select {
	case <-lease.Lost():
		t.Fatalf("Lost closed on a lease held and renewed for %v", hold)
	default:
	}
	release(t, lease)
}

// lostWhenTakenOver puts a rival's claim in place of a held lease, as a
// holder granted after a pause would be, and checks the three promises a
// compare-and-delete release and an owner-checked renewal keep: Lost
// closes, the stale lease's Release reaches the server and answers
// ErrNotHeld, and the rival's claim survives that release.
func lostWhenTakenOver[C any](t *testing.T, b Backend[C], key string) {
	lockers := pair(t, b)
	lease, err := lockers[0].Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	drop, err := b.TakeOver(t.Context(), key)
	if err != nil {
		release(t, lease)
		t.Fatalf("take over: %v", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := drop(ctx); err != nil {
			t.Errorf("drop the rival's claim: %v", err)
		}
	}()
	began := time.Now()
	select {
	case <-lease.Lost():
		t.Logf("%s: Lost closed %v after the lease was taken over", b.Name, time.Since(began).Round(time.Millisecond))
	case <-time.After(b.expiry() + 5*time.Second):
		t.Errorf("Lost still open %v after the lease was taken over", time.Since(began))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lease.Release(ctx); !errors.Is(err, locking.ErrNotHeld) {
		t.Errorf("release of a lease taken over = %v, want ErrNotHeld", err)
	}
	// The rival's claim outlives the test: nobody may acquire meanwhile.
	if !refused(t, lockers[1], key, 500*time.Millisecond) {
		t.Errorf("acquired while a rival held the key: the stale release (or renewal) removed the rival's claim")
	}
	if b.Leftovers != nil {
		if n := leftovers(t, b, key, 1); n != 1 {
			t.Errorf("%d objects for the key after the stale release, want the rival's claim alone", n)
		}
	}
}

// cancelledWaiterMidQueue queues three waiters behind a holder, with the
// fallback timers off, cancels the middle one, and checks that each
// release still wakes the next live waiter promptly: a wake-up handed to
// the cancelled waiter, or a queue that forgets it, would stall.
func cancelledWaiterMidQueue[C any](t *testing.T, b Backend[C], key string) {
	qb := b
	qb.Config = *b.QueueConfig
	lockers := []locking.Locker{open(t, qb), open(t, qb), open(t, qb), open(t, qb)}
	held, err := lockers[0].Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease locking.Lease
		err   error
	}
	var (
		results = make([]chan result, 3)
		cancels = make([]context.CancelFunc, 3)
	)
	for i := range results {
		results[i] = make(chan result, 1)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		cancels[i] = cancel
		defer cancel()
		queued := queueGrows(t, b, key)
		go func() {
			lease, err := lockers[i+1].Acquire(ctx, key)
			results[i] <- result{lease, err}
		}()
		queued() // in this order: a fixed sleep let a waiter slow to start on a loaded machine queue behind the next
	}
	cancels[1]()
	if r := <-results[1]; r.err == nil {
		release(t, r.lease)
		t.Fatal("the cancelled waiter acquired the held lock")
	}
	// Far below the waiters' ctx (a minute) and fallback timers (off, or
	// 10 minutes), far above a wake-up's milliseconds on a loaded machine.
	const prompt = 5 * time.Second
	next := held
	for _, i := range []int{0, 2} {
		release(t, next)
		select {
		case r := <-results[i]:
			if r.err != nil {
				t.Fatalf("waiter %d: %v", i, r.err)
			}
			next = r.lease
		case <-time.After(prompt):
			t.Fatalf("waiter %d still waits %v after the release (the cancelled waiter %s)", i, prompt,
				map[bool]string{true: "was ahead of it", false: "was behind it"}[i == 2])
		}
	}
	release(t, next)
}

// queueGrows reads what the server holds for key and returns a wait for
// that to grow: a waiter started meanwhile has queued. Without Leftovers it
// sleeps 200 ms instead.
func queueGrows[C any](t *testing.T, b Backend[C], key string) func() {
	t.Helper()
	if b.Leftovers == nil {
		return func() { time.Sleep(200 * time.Millisecond) }
	}
	count := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n, err := b.Leftovers(ctx, key)
		if err != nil {
			t.Fatalf("count leftovers: %v", err)
		}
		return n
	}
	before := count()
	return func() {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); count() <= before; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the key's objects still %d 10s after a waiter started: it did not queue", before)
			}
		}
	}
}

func killedHolderFrees[C any](t *testing.T, b Backend[C], key string) {
	holder := startChild(t, request{Mode: "hold", Config: config(t, b), Key: key})
	if _, err := holder.expect("held"); err != nil {
		t.Fatal(err)
	}
	l := open(t, b)
	if err := holder.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	limit := b.expiry() + 5*time.Second
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	lease, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("the lock of a SIGKILLed holder was not free after %v: %v", limit, err)
	}
	t.Logf("%s: lock freed %v after its holder was SIGKILLed (expiry %v)", b.Name, time.Since(killed).Round(time.Millisecond), b.expiry())
	release(t, lease)
}

func exclusiveAcrossProcesses[C any](t *testing.T, b Backend[C], key string) {
	dir := t.TempDir()
	const procs, rounds = 3, 15
	children := make([]*childProc, procs)
	for i := range children {
		children[i] = startChild(t, request{Mode: "count", Config: config(t, b), Key: key, Dir: dir, Rounds: rounds})
	}
	// A start barrier: every child has opened its Locker before any starts
	// counting, so their rounds overlap instead of running one after another.
	for i, c := range children {
		if line, err := c.expect("ready"); err != nil {
			t.Fatalf("process %d: %v (last line %q)", i, err, line)
		}
	}
	for i, c := range children {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			t.Fatalf("start process %d: %v", i, err)
		}
	}
	for i, c := range children {
		if line, err := c.expect("done"); err != nil {
			t.Fatalf("process %d: %v (last line %q)", i, err, line)
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "counter"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(raw)), strconv.Itoa(procs*rounds); got != want {
		t.Errorf("counter = %s after %s exclusive increments by %d processes: updates were lost", got, want, procs)
	}
}

// PrivateServer starts a server of the test's own with start (one the test
// may pause), stopped when the test ends.
func PrivateServer(t *testing.T, start func(context.Context, testbed.Options) (*testbed.Server, error)) *testbed.Server {
	t.Helper()
	return privateServer(t, start, testbed.Options{})
}

// privateServer is PrivateServer with options.
func privateServer(t *testing.T, start func(context.Context, testbed.Options) (*testbed.Server, error), opts testbed.Options) *testbed.Server {
	t.Helper()
	srv, err := start(t.Context(), opts)
	if errors.Is(err, testbed.ErrMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	return srv
}

// CancelWhileServerPaused checks that an Acquire cancelled while srv (the
// server b.Config points at) is paused returns at once, leaving the removal
// of its queue entry to the background, and that the removal lands once the
// server is back. b needs Leftovers.
func CancelWhileServerPaused[C any](t *testing.T, b Backend[C], srv *testbed.Server) {
	lockers := pair(t, b)
	const key = "sku/cancelled"
	held, err := lockers[0].Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		lease, err := lockers[1].Acquire(ctx, key)
		if err == nil {
			release(t, lease)
		}
		done <- err
	}()
	if n := leftovers(t, b, key, 2); n != 2 {
		t.Fatalf("%d queue entries, want the holder's and the waiter's", n)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	cancel()
	cancelled := time.Now()
	select {
	case err := <-done:
		took := time.Since(cancelled)
		t.Logf("%s: a cancelled Acquire returned %v after its ctx ended, with the server paused", b.Name, took.Round(time.Millisecond))
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled Acquire = %v, want an error wrapping context.Canceled", err)
		}
		if took > time.Second {
			t.Errorf("a cancelled Acquire took %v to return: it waited for its cleanup", took)
		}
	case <-time.After(10 * time.Second):
		t.Error("a cancelled Acquire did not return within 10s")
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for leftovers(t, b, key, 1) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the cancelled waiter's queue entry is still there 5s after the server came back")
		}
	}
	release(t, held)
}

// keysEnv sets how many distinct keys ManyKeys takes: 1000 by default, and
// 100000 for the soak whose figures docs quote.
const keysEnv = "OVERSOLD_LOCKTEST_KEYS"

// manyKeys acquires and releases many distinct keys on one Locker, 8 at a
// time, and checks that the Locker's goroutines and live heap stay flat (a
// goroutine, timer, watch or subscription kept per key ever used would grow
// with them) and that released keys leave nothing behind. It logs the figures, and the
// server's State.
func manyKeys[C any](t *testing.T, b Backend[C], prefix string) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv(keysEnv)); err == nil && v > 0 {
		n = v
	}
	l := open(t, b)
	// run takes keys from+1..to, workers at a time.
	run := func(from, to, workers int) {
		var (
			next atomic.Int64
			wg   sync.WaitGroup
		)
		next.Store(int64(from))
		for range workers {
			wg.Go(func() {
				for i := next.Add(1); i <= int64(to); i = next.Add(1) {
					lease, err := l.Acquire(t.Context(), fmt.Sprintf("%s/%d", prefix, i))
					if err != nil {
						t.Errorf("acquire key %d: %v", i, err)
						return
					}
					release(t, lease)
				}
			})
		}
		wg.Wait()
	}
	// A first tenth, 16 at a time, grows the pools and sessions to more
	// than what 8 workers use.
	warm := max(n/10, 50)
	run(0, warm, 16)
	firstWait(t, l, prefix+"/wait")
	footBefore := settledFootprint(t, b)
	before := settledGoroutines()
	heapBefore := liveHeap()
	began := time.Now()
	run(warm, warm+n, 8)
	took := time.Since(began)
	// Lingering subscriptions and background cleanups end within seconds.
	after := runtime.NumGoroutine()
	for deadline := time.Now().Add(10 * time.Second); after > before && time.Now().Before(deadline); after = runtime.NumGoroutine() {
		time.Sleep(100 * time.Millisecond)
	}
	footAfter := footprintBack(t, b, footBefore)
	settledGoroutines()
	heapAfter := liveHeap()
	grown := float64(heapAfter.objects-heapBefore.objects) / float64(n)
	state := ""
	if b.State != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		if state, err = b.State(ctx); err != nil {
			t.Errorf("server state: %v", err)
		}
	}
	t.Logf("%s: %d distinct keys in %v (%.0f/s): goroutines %d before, %d after; live heap %d -> %d objects (%+.3f a key), %d -> %d bytes (%+.1f a key); %s%s",
		b.Name, n, took.Round(time.Millisecond), float64(n)/took.Seconds(), before, after,
		heapBefore.objects, heapAfter.objects, grown, heapBefore.bytes, heapAfter.bytes, float64(heapAfter.bytes-heapBefore.bytes)/float64(n),
		state, footprintLine(footBefore, footAfter))
	if after > before+4 {
		t.Errorf("goroutines grew from %d to %d over %d distinct keys", before, after, n)
	}
	if grown > maxObjectsPerKey {
		t.Errorf("live heap grew by %.3f objects a key over %d distinct keys, more than %g: something is kept per key (a timer never stopped, a map entry)",
			grown, n, maxObjectsPerKey)
	}
	for what, was := range footBefore {
		if now := footAfter[what]; now > was {
			t.Errorf("%s grew from %d to %d over %d distinct keys", what, was, now, n)
		}
	}
	if b.Leftovers != nil {
		for _, i := range []int{1, warm + n/2, warm + n} {
			if left := leftovers(t, b, fmt.Sprintf("%s/%d", prefix, i), 0); left != 0 {
				t.Errorf("key %d: %d objects left after release", i, left)
			}
		}
	}
}

// firstWait makes one Acquire of l wait 200 ms for key, held by l, so that
// what a Locker starts on its first wait and keeps (a Redis Notifier's two
// goroutines per server) runs before ManyKeys counts: under load, one
// Acquire of distinct keys may wait (a Redlock attempt without a majority
// retries through the queue), and that would count as growth.
func firstWait(t *testing.T, l locking.Locker, key string) {
	held, err := l.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		if lease, err := l.Acquire(ctx, key); err == nil {
			release(t, lease)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second): // a wait that ignores ctx: WaitDeadline fails it
	}
	release(t, held)
	<-done
}

// footprint reads b.Footprint, nil without one.
func footprint[C any](t *testing.T, b Backend[C]) map[string]int {
	t.Helper()
	if b.Footprint == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fp, err := b.Footprint(ctx)
	if err != nil {
		t.Fatalf("server footprint: %v", err)
	}
	return fp
}

// settledFootprint is the footprint once it stops falling (a second
// without change, within 15s): what a warm Locker holds, once the server
// has reaped what the warm-up left to reap.
func settledFootprint[C any](t *testing.T, b Backend[C]) map[string]int {
	t.Helper()
	fp := footprint(t, b)
	for deadline := time.Now().Add(15 * time.Second); fp != nil && time.Now().Before(deadline); {
		time.Sleep(time.Second)
		next := footprint(t, b)
		if maps.Equal(next, fp) {
			break
		}
		fp = next
	}
	return fp
}

// footprintBack waits up to 15s for every count to come back to was (the
// server reaps empty parents, watches end with their leases), and returns
// the last reading.
func footprintBack[C any](t *testing.T, b Backend[C], was map[string]int) map[string]int {
	t.Helper()
	fp := footprint(t, b)
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); fp = footprint(t, b) {
		back := true
		for what, n := range was {
			back = back && fp[what] <= n
		}
		if back {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fp
}

// footprintLine is "; what before -> after" for each count, sorted.
func footprintLine(before, after map[string]int) string {
	var b strings.Builder
	for _, what := range slices.Sorted(maps.Keys(before)) {
		fmt.Fprintf(&b, "; %s %d -> %d", what, before[what], after[what])
	}
	return b.String()
}

// The helper-process protocol: the parent starts the test binary with
// childEnv set to a JSON request; the child answers with lines on stdout.
const childEnv = "OVERSOLD_LOCKTEST_CHILD"

type request struct {
	Mode   string          // "hold": acquire, say "held", wait for stdin to close; "count": say "ready", wait for a line on stdin, increment a file counter under the lock
	Watch  bool            // "hold": meanwhile print whether Lost is open (watchLost)
	Config json.RawMessage // b.Config, for the open given to Main
	Key    string
	Dir    string
	Rounds int
}

// config is b.Config as a request carries it.
func config[C any](t *testing.T, b Backend[C]) json.RawMessage {
	t.Helper()
	raw, err := json.Marshal(b.Config)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

type childProc struct {
	cmd   *exec.Cmd
	lines *bufio.Scanner
	stdin io.WriteCloser
}

func startChild(t *testing.T, req request) *childProc {
	t.Helper()
	spec, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return &childProc{cmd: cmd, lines: bufio.NewScanner(stdout), stdin: stdin}
}

// expect reads lines until one starts with word, within two minutes.
func (c *childProc) expect(word string) (string, error) {
	type result struct {
		line string
		err  error
	}
	got := make(chan result, 1)
	go func() {
		var last string
		for c.lines.Scan() {
			last = c.lines.Text()
			if strings.HasPrefix(last, word) {
				got <- result{line: last}
				return
			}
		}
		got <- result{line: last, err: fmt.Errorf("helper process ended before %q", word)}
	}()
	select {
	case r := <-got:
		return r.line, r.err
	case <-time.After(2 * time.Minute):
		return "", fmt.Errorf("no %q from the helper process in 2m", word)
	}
}

// child runs one helper-process request, opening the backend with open,
// and returns the exit status.
func child[C any](spec string, open func(context.Context, C) (locking.Locker, error)) int {
	var (
		req request
		cfg C
	)
	if err := json.Unmarshal([]byte(spec), &req); err != nil {
		fmt.Fprintln(os.Stderr, "locktest child:", err)
		return 2
	}
	if err := json.Unmarshal(req.Config, &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "locktest child:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := open(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "locktest child:", err)
		return 1
	}
	defer l.Close()
	switch req.Mode {
	case "hold":
		lease, err := l.Acquire(ctx, req.Key)
		if err != nil {
			fmt.Fprintln(os.Stderr, "locktest child:", err)
			return 1
		}
		fmt.Printf("held %d\n", lease.Token())
		stop, watched := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(watched)
			if req.Watch {
				watchLost(lease, stop)
			}
		}()
		bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin
		close(stop)
		<-watched
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer rcancel()
		lease.Release(rctx)
	case "count":
		fmt.Println("ready")
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			fmt.Fprintln(os.Stderr, "locktest child: no start signal:", err)
			return 1
		}
		for range req.Rounds {
			if err := countOnce(ctx, l, req); err != nil {
				fmt.Fprintln(os.Stderr, "locktest child:", err)
				return 1
			}
		}
		fmt.Println("done")
	}
	return 0
}

// countOnce increments a file counter under the lock; a marker file
// created with O_EXCL proves that no other process is inside meanwhile.
func countOnce(ctx context.Context, l locking.Locker, req request) error {
	lease, err := l.Acquire(ctx, req.Key)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		lease.Release(rctx)
	}()
	marker := filepath.Join(req.Dir, "inside")
	f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("two processes inside the lock at once: %w", err)
	}
	f.Close()
	path := filepath.Join(req.Dir, "counter")
	n := 0
	if raw, err := os.ReadFile(path); err == nil {
		n, _ = strconv.Atoi(strings.TrimSpace(string(raw)))
	}
	time.Sleep(time.Millisecond)
	if err := os.WriteFile(path, []byte(strconv.Itoa(n+1)), 0o600); err != nil {
		return err
	}
	return os.Remove(marker)
}

// Closing returns l with a Close that, after l's, closes the clients an
// open function made for it (the suite requires none left running).
func Closing(l locking.Locker, closers ...func() error) locking.Locker {
	return closing{Locker: l, closers: closers}
}

type closing struct {
	locking.Locker
	closers []func() error
}

func (c closing) Close() error {
	errs := []error{c.Locker.Close()}
	for _, close := range c.closers {
		errs = append(errs, close())
	}
	return errors.Join(errs...)
}
