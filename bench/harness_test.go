package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/backends"
)

const (
	// ttl is every implementation's lease time to live: long next to any
	// handoff, so no lease expires during a run and no renewal races a release.
	ttl = 10 * time.Second
	// hold is the critical section of a hot-key contender, the same for all:
	// long enough that the lock is really held, short enough that the lock's
	// own cost dominates.
	hold = 100 * time.Microsecond
	// acquireTimeout bounds one Acquire, so a broken backend fails the
	// benchmark instead of hanging it; runTimeout bounds one run of a
	// sub-benchmark, openTimeout the opening of the contenders.
	acquireTimeout = 30 * time.Second
	runTimeout     = 3 * time.Minute
	openTimeout    = time.Minute
	releaseTimeout = 10 * time.Second
)

// unlockFunc releases what a lockFunc took.
type unlockFunc func(ctx context.Context) error

// contender is one party competing for locks, with a client of its own.
type contender struct {
	// lock blocks until key is held, ctx ends or the implementation fails.
	lock  func(ctx context.Context, key string) (unlockFunc, error)
	close func() error
}

// impl is one lock implementation under test.
type impl struct {
	name string // sub-benchmark name: "ours", "redsync", ...
	wait string // how its waiters wait, printed for the results table
	// skip, if set, is why this implementation cannot run (ours not yet in
	// backends.Open).
	skip string
	open func(ctx context.Context) (*contender, error)
}

// ours opens our backend by name, as orderd and the lab do.
func ours(name string, cfg backends.Config, wait string) impl {
	cfg.TTL = ttl
	im := impl{name: "ours", wait: wait, open: func(ctx context.Context) (*contender, error) {
		l, err := backends.Open(ctx, name, cfg)
		if err != nil {
			return nil, err
		}
		return lockerContender(l), nil
	}}
	if !slices.Contains(backends.Names, name) {
		im.skip = fmt.Sprintf("our %s backend is not in locking/backends.Open yet", name)
	}
	return im
}

func lockerContender(l locking.Locker) *contender {
	return &contender{
		lock: func(ctx context.Context, key string) (unlockFunc, error) {
			lease, err := l.Acquire(ctx, key)
			if err != nil {
				return nil, err
			}
			return lease.Release, nil
		},
		close: l.Close,
	}
}

// runID keeps this binary's keys apart from other runs on given servers.
var runID = func() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

var keySeq atomic.Int64

// newKey returns a key no run has used: letters, digits and '-' only, and
// short enough for GET_LOCK's 64 characters with a suffix.
func newKey(workload string) string {
	return fmt.Sprintf("ob-%s-%s-%d", runID, workload, keySeq.Add(1))
}

// pool keeps one implementation's contenders across the runs of a
// sub-benchmark: Go runs each several times while it sizes b.N, and opening
// 32 sessions each time would cost more than a 1x run.
type pool struct {
	im   impl
	open []*contender
}

// get returns n warmed contenders, opening the missing ones.
func (p *pool) get(b *testing.B, n int) []*contender {
	b.Helper()
	if len(p.open) >= n {
		return p.open[:n]
	}
	ctx, cancel := context.WithTimeout(b.Context(), openTimeout)
	defer cancel()
	fresh := make([]*contender, n-len(p.open))
	errs := make([]error, len(fresh))
	var wg sync.WaitGroup
	for i := range fresh {
		wg.Go(func() { fresh[i], errs[i] = openWarm(ctx, p.im) })
	}
	wg.Wait()
	for _, c := range fresh {
		if c != nil {
			p.open = append(p.open, c)
		}
	}
	if err := errors.Join(errs...); err != nil {
		b.Fatalf("open %s: %v", p.im.name, err)
	}
	return p.open[:n]
}

// openWarm opens a contender and takes one lock with it, so that dialing,
// sessions, prepared statements and script loading are not measured.
func openWarm(ctx context.Context, im impl) (*contender, error) {
	c, err := im.open(ctx)
	if err != nil {
		return nil, err
	}
	unlock, err := c.lock(ctx, newKey("warm"))
	if err == nil {
		err = release(unlock)
	}
	if err != nil {
		c.close()
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	return c, nil
}

func release(unlock unlockFunc) error {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	return unlock(ctx)
}

func (p *pool) close() {
	for _, c := range p.open {
		c.close()
	}
	p.open = nil
}

// workloads, in the order they run.
var workloads = []struct {
	name       string
	contenders int // 0: uncontended
}{
	{"uncontended", 0},
	{"hot-1", 1},
	{"hot-8", 8},
	{"hot-32", 32},
}

// runServer runs every workload against every implementation as
// sub-benchmarks <workload>/<impl>: implementations take turns within a
// workload, so a noisy neighbour on the machine hits them alike.
func runServer(b *testing.B, server, version string, impls []impl) {
	// Printed here, before any sub-benchmark: a line printed while one runs
	// would split its result line.
	fmt.Printf("oversold-server: %s %s\n", server, version)
	// The machine is shared: the load when each run began goes in the table.
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			fmt.Printf("oversold-load: %s %s\n", server, f[0])
		}
	}
	for _, im := range impls {
		fmt.Printf("oversold-impl: %s %s %s\n", server, im.name, im.wait)
	}
	pools := make([]*pool, len(impls))
	for i, im := range impls {
		pools[i] = &pool{im: im}
	}
	b.Cleanup(func() {
		for _, p := range pools {
			p.close()
		}
	})
	for _, w := range workloads {
		b.Run(w.name, func(b *testing.B) {
			for _, p := range pools {
				b.Run(p.im.name, func(b *testing.B) {
					if p.im.skip != "" {
						b.Skip(p.im.skip)
					}
					// One implementation's clients at a time: idle
					// sessions of another would load the server while
					// this one is measured, and ZooKeeper admits only 60
					// connections per client address (maxClientCnxns).
					for _, o := range pools {
						if o != p {
							o.close()
						}
					}
					if w.contenders == 0 {
						uncontended(b, p)
					} else {
						hot(b, p, w.contenders)
					}
				})
			}
		})
	}
}

// uncontended takes and releases b.N locks, each on a key of its own.
func uncontended(b *testing.B, p *pool) {
	c := p.get(b, 1)[0]
	ctx, cancel := context.WithTimeout(b.Context(), runTimeout)
	defer cancel()
	prefix := newKey("u")
	waits := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		t0 := time.Now()
		actx, acancel := context.WithTimeout(ctx, acquireTimeout)
		unlock, err := c.lock(actx, fmt.Sprintf("%s-%d", prefix, i))
		acancel()
		waits = append(waits, time.Since(t0))
		if err != nil {
			b.Fatalf("acquire: %v", err)
		}
		if err := release(unlock); err != nil {
			b.Fatalf("release: %v", err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "acq/s")
	b.ReportMetric(ms(percentile(waits, 0.99)), "wait-p99-ms")
}

// hot lets n contenders take turns on one key. Total acquisitions are
// max(b.N, n): every contender acquires at least once (so -benchtime 1x
// exercises the contended path), then they share the rest of b.N.
func hot(b *testing.B, p *pool, n int) {
	cs := p.get(b, n)
	ctx, cancel := context.WithTimeout(b.Context(), runTimeout)
	defer cancel()
	key := newKey(fmt.Sprintf("h%d", n))
	base := time.Now()
	now := func() int64 { return int64(time.Since(base)) } // monotonic

	var (
		extra    atomic.Int64 // acquisitions left beyond each contender's first
		holders  atomic.Int32 // > 1 means the lock let two in
		overlaps atomic.Int64
		// relStart is when the last holder began its Release, -1 before
		// the first. Stored before Release is called, so a handoff spans
		// the whole release path plus the next holder's wake-up and grant.
		// relBy is who that holder was: a contender that takes the lock
		// straight back (barging past sleeping waiters) hands nothing
		// off, and counting it would credit sleep-and-retry locks with
		// the releaser's own round trip. Both are written by the holder
		// only and read by the next holder, so the lock orders them.
		relStart atomic.Int64
		relBy    atomic.Int64
		// retakes counts acquisitions whose acquirer was also the previous
		// holder: a barging lock's acq/s is mostly these, while a fair
		// queue hands every release to another contender.
		retakes  atomic.Int64
		errOnce  sync.Once
		firstErr error
	)
	extra.Store(int64(max(b.N-n, 0)))
	relStart.Store(-1)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	handoffs := make([][]time.Duration, n)
	waits := make([][]time.Duration, n)
	gate := make(chan struct{}) // start barrier: contention from the first try
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			<-gate
			for first := true; first || extra.Add(-1) >= 0; first = false {
				if ctx.Err() != nil {
					return
				}
				t0 := now()
				actx, acancel := context.WithTimeout(ctx, acquireTimeout)
				unlock, err := c.lock(actx, key)
				acancel()
				t1 := now()
				if err != nil {
					fail(fmt.Errorf("contender %d: acquire: %w", i, err))
					return
				}
				if holders.Add(1) != 1 {
					overlaps.Add(1)
				}
				if prev := relStart.Load(); prev >= 0 {
					if relBy.Load() != int64(i) {
						handoffs[i] = append(handoffs[i], time.Duration(t1-prev))
					} else {
						retakes.Add(1)
					}
				}
				waits[i] = append(waits[i], time.Duration(t1-t0))
				time.Sleep(hold)
				holders.Add(-1)
				relBy.Store(int64(i))
				relStart.Store(now())
				if err := release(unlock); err != nil {
					fail(fmt.Errorf("contender %d: release: %w", i, err))
					return
				}
			}
		})
	}
	b.ResetTimer()
	start := time.Now()
	close(gate)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	if o := overlaps.Load(); o > 0 {
		b.Fatalf("mutual exclusion violated %d times: the figures mean nothing", o)
	}
	all, allWaits := slices.Concat(handoffs...), slices.Concat(waits...)
	total := len(allWaits)
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(total), "ns/op") // per acquisition, not per b.N
	b.ReportMetric(float64(total)/elapsed.Seconds(), "acq/s")
	if len(all) > 0 {
		b.ReportMetric(ms(percentile(all, 0.50)), "handoff-p50-ms")
		b.ReportMetric(ms(percentile(all, 0.99)), "handoff-p99-ms")
	}
	b.ReportMetric(ms(percentile(allWaits, 0.99)), "wait-p99-ms")
	// Of the acquisitions after the first, the share that went back to
	// the contender that had just released (100 with one contender).
	if total > 1 {
		b.ReportMetric(100*float64(retakes.Load())/float64(total-1), "retake-%")
	}
}

// percentile is the nearest-rank percentile of d (sorted in place).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(float64(len(d))*p+0.999999) - 1
	return d[min(max(i, 0), len(d)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// TestMain shares one set of servers across the binary (testbed.Main stops
// them) and prints the machine the figures come from, for the formatter.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		printMachine()
	}
	testbed.Main(m)
}

func printMachine() {
	cpu := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	kernel := runtime.GOOS
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel += " " + strings.TrimSpace(string(b))
	}
	benchtime := "1s"
	if f := flag.Lookup("test.benchtime"); f != nil {
		benchtime = f.Value.String()
	}
	fmt.Printf("oversold-cpu: %s\n", cpu)
	fmt.Printf("oversold-cores: %d\n", runtime.NumCPU())
	fmt.Printf("oversold-kernel: %s\n", kernel)
	fmt.Printf("oversold-go: %s\n", runtime.Version())
	fmt.Printf("oversold-date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Printf("oversold-benchtime: %s\n", benchtime)
	fmt.Printf("oversold-setup: TTL %v for all; hot-key holders hold the lock %v; every contender has a client of its own\n", ttl, hold)
}
