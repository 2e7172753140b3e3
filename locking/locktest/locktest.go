// Package locktest is the one conformance suite every lock backend passes.
//
// A backend's test file only wires it up:
//
//	func TestMain(m *testing.M) { locktest.Main(m) }
//
//	func TestConformance(t *testing.T) {
//		locktest.Run(t, locktest.Backend{Name: "redis", Config: backends.Config{RedisAddr: testbed.Redis(t)}, ...})
//	}
//
// The suite opens the backend through backends.Open, in the test process and
// in helper processes (the test binary started again in helper mode), so the
// claims it checks hold across OS processes, not only goroutines.
package locktest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
)

// Backend describes the backend under test.
type Backend struct {
	// Name and Config open the backend with backends.Open, here and in
	// helper processes.
	Name   string
	Config backends.Config
	// InProcess marks a lock that is exclusive only within one process
	// (local): the cross-process, expiry and theft checks do not apply.
	InProcess bool
	// Steal takes the lease on key away behind its holder's back: deletes
	// the key, expires the session, hands the row to someone else.
	Steal func(ctx context.Context, key string) error
	// Leftovers counts what the server holds for key (keys, znodes, rows).
	Leftovers func(ctx context.Context, key string) (int, error)
	// Expiry bounds how long a dead holder's lock takes to free; 0 = the TTL.
	Expiry time.Duration
}

func (b Backend) ttl() time.Duration {
	if b.Config.TTL > 0 {
		return b.Config.TTL
	}
	return backends.DefaultTTL
}

func (b Backend) expiry() time.Duration {
	if b.Expiry > 0 {
		return b.Expiry
	}
	return b.ttl()
}

// Main is the TestMain of a backend package: it serves helper-process
// requests, and otherwise runs the tests and stops the shared servers.
func Main(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(child(spec))
	}
	testbed.Main(m)
}

// Run checks every promise of the locking contract against b.
func Run(t *testing.T, b Backend) {
	t.Helper()
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
	t.Run("LostWhenStolen", func(t *testing.T) {
		if b.Steal == nil {
			t.Skip("this backend's leases cannot be taken away")
		}
		lostWhenStolen(t, b, prefix+"/stolen")
	})
}

// pair returns two Lockers with separate clients, or for an in-process
// backend one Locker twice (two would not exclude each other).
func pair(t *testing.T, b Backend) []locking.Locker {
	first := open(t, b)
	if b.InProcess {
		return []locking.Locker{first, first}
	}
	return []locking.Locker{first, open(t, b)}
}

// open opens a Locker with its own clients, closed when the test ends.
func open(t *testing.T, b Backend) locking.Locker {
	t.Helper()
	l, err := backends.Open(t.Context(), b.Name, b.Config)
	if err != nil {
		t.Fatalf("open %s: %v", b.Name, err)
	}
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
				if tok := lease.Token(); tok == 0 {
					noToken.Store(true)
				} else if prev := lastToken.Swap(tok); tok <= prev {
					t.Errorf("token %d granted after %d", tok, prev)
				}
				v := counter.Load()
				time.Sleep(100 * time.Microsecond)
				counter.Store(v + 1)
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
	if got, want := counter.Load(), int64(workers*rounds); got != want {
		t.Errorf("counter = %d after %d exclusive increments: updates were lost", got, want)
	}
	if noToken.Load() && lastToken.Load() != 0 {
		t.Errorf("some grants had a token and some had none")
	}
}

func releaseByOwnerOnly(t *testing.T, b Backend, key string) {
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
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if third, err := a.Acquire(ctx, key); err == nil {
		release(t, third)
		t.Fatal("the lock was granted while its holder still held it: a stale release freed it")
	}
	release(t, second)
}

func waitDeadline(t *testing.T, b Backend, key string) {
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
	lease, err := waiter.Acquire(ctx, key)
	took := time.Since(began)
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
		if n := leftovers(t, b, key); n != 1 {
			t.Errorf("while one lease is held, %d objects exist for the key; the cancelled waiter left some behind", n)
		}
	}
	release(t, held)
	if b.Leftovers != nil {
		if n := leftovers(t, b, key); n != 0 {
			t.Errorf("%d objects remain for the key after release", n)
		}
	}
}

func leftovers(t *testing.T, b Backend, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := b.Leftovers(ctx, key)
	if err != nil {
		t.Fatalf("count leftovers: %v", err)
	}
	return n
}

func tokensIncrease(t *testing.T, b Backend, key string) {
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

func renewalKeepsLease(t *testing.T, b Backend, key string) {
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

func lostWhenStolen(t *testing.T, b Backend, key string) {
	l := open(t, b)
	lease, err := l.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Steal(t.Context(), key); err != nil {
		t.Fatalf("steal: %v", err)
	}
	began := time.Now()
	select {
	case <-lease.Lost():
		t.Logf("%s: Lost closed %v after the lease was taken away", b.Name, time.Since(began).Round(time.Millisecond))
	case <-time.After(b.expiry() + 5*time.Second):
		t.Fatalf("Lost still open %v after the lease was taken away", time.Since(began))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lease.Release(ctx); !errors.Is(err, locking.ErrNotHeld) {
		t.Errorf("release of a lost lease = %v, want ErrNotHeld", err)
	}
}

func killedHolderFrees(t *testing.T, b Backend, key string) {
	holder := startChild(t, request{Mode: "hold", Name: b.Name, Config: b.Config, Key: key})
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

func exclusiveAcrossProcesses(t *testing.T, b Backend, key string) {
	dir := t.TempDir()
	const procs, rounds = 3, 15
	children := make([]*childProc, procs)
	for i := range children {
		children[i] = startChild(t, request{Mode: "count", Name: b.Name, Config: b.Config, Key: key, Dir: dir, Rounds: rounds})
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

// The helper-process protocol: the parent starts the test binary with
// childEnv set to a JSON request; the child answers with lines on stdout.
const childEnv = "OVERSOLD_LOCKTEST_CHILD"

type request struct {
	Mode   string // "hold": acquire, say "held", wait for stdin to close; "count": increment a file counter under the lock
	Name   string
	Config backends.Config
	Key    string
	Dir    string
	Rounds int
}

type childProc struct {
	cmd   *exec.Cmd
	lines *bufio.Scanner
	stdin interface{ Close() error }
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

// child runs one helper-process request and returns the exit status.
func child(spec string) int {
	var req request
	if err := json.Unmarshal([]byte(spec), &req); err != nil {
		fmt.Fprintln(os.Stderr, "locktest child:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := backends.Open(ctx, req.Name, req.Config)
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
		bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer rcancel()
		lease.Release(rctx)
	case "count":
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
