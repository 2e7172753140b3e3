// The client must offer 100 000 new keys a minute, which it cannot under
// the race detector on a 2-core box: make test runs this file without it.

//go:build !race

package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/locktest"
	"github.com/oversold-lab/oversold/locking/zklock"
)

// soakEnv turns TestReaperKeepsUp into the minute-long soak whose figures
// locking/README.md quotes; rateEnv changes the rate it offers.
const (
	soakEnv = "OVERSOLD_ZK_REAPER_SOAK"
	rateEnv = "OVERSOLD_ZK_REAPER_RATE" // new key parents a minute, 100000 by default
)

// zkDefaultReaping is ZooKeeper's own reaper setting, which the testbed
// overrides: a check a minute, at most 10 000 deletions a minute.
var zkDefaultReaping = []string{"-Dznode.container.checkIntervalMs=60000", "-Dznode.container.maxPerMinute=10000"}

// The server must reap empty key parents as fast as a catalogue adds keys,
// or their number grows without bound. A private server (its reaper serves
// this test alone) is offered new key parents at 100 000 a minute, each
// made as zklock makes it and left as a lock's use leaves it, and must
// keep up: all reaped within 5 s of the last (15 s for the soak), and never
// more than 10 s of arrivals waiting. The same few seconds on a server
// with ZooKeeper's default reaper must fail. The soak also runs on a
// three-node ensemble.
func TestReaperKeepsUp(t *testing.T) {
	rate := 100_000
	if v, err := strconv.Atoi(os.Getenv(rateEnv)); err == nil && v > 0 {
		rate = v
	}
	cfg := soakConfig{rate: rate, parents: rate / 20, drain: 5 * time.Second, attempts: reaperAttempts} // 3 s at 100k/min
	if os.Getenv(soakEnv) != "" {
		cfg = soakConfig{rate: rate, parents: rate, drain: 15 * time.Second, attempts: 1} // a minute
	}
	t.Run("tuned", func(t *testing.T) {
		srv := locktest.PrivateServer(t, testbed.StartZooKeeper)
		if err := keptUp(t, []string{srv.Addr}, cfg); err != nil {
			t.Error(err)
		}
	})
	// A three-node ensemble: the leader reaps, every write is a quorum's.
	t.Run("ensemble", func(t *testing.T) {
		if os.Getenv(soakEnv) == "" {
			t.Skip("three servers for a minute: the soak only")
		}
		if err := keptUp(t, testbed.ZooKeeperEnsemble(t), cfg); err != nil {
			t.Error(err)
		}
	})
	t.Run("default", func(t *testing.T) {
		if os.Getenv(soakEnv) != "" {
			t.Skip("the soak measures the tuned server only")
		}
		srv := locktest.PrivateServer(t, func(ctx context.Context, o testbed.Options) (*testbed.Server, error) {
			o.Args = zkDefaultReaping
			return testbed.StartZooKeeper(ctx, o)
		})
		// Every measurement that offered the rate must fail, and one must
		// have: the first that did decides.
		for attempt := 1; ; attempt++ {
			r := reaperSoak(t, []string{srv.Addr}, cfg, attempt)
			err := r.verdict(cfg)
			switch {
			case r.offered >= 0.9*float64(cfg.rate) && err == nil:
				t.Error("the check passed a server with ZooKeeper's default reaper: it proves nothing")
			case r.offered >= 0.9*float64(cfg.rate):
				t.Logf("as it should, the check fails with the default reaper: %v", err)
			case attempt < cfg.attempts:
				continue
			default:
				t.Errorf("the client fell behind in all %d measurements (%v): the default reaper was not tested", attempt, err)
			}
			return
		}
	})
}

// reaperAttempts bounds the measurements of one server: the tuned one
// passes on the first that keeps up. A 2-core machine shared with other
// test runs (load 16) starves the server of the CPU that 100 000 new
// parents a minute take (5000 in 3 s: 15 000 writes): the client offered
// only 50 000 to 63 000 a minute in 2 measurements of 3 (i12a), which
// proves nothing either way. ZooKeeper's default reaper, a check a
// minute, leaves every parent in each measurement.
const reaperAttempts = 4

// keptUp measures c.attempts times at most and returns nil at the first
// measurement whose verdict is nil, otherwise the last verdict.
func keptUp(t *testing.T, servers []string, c soakConfig) (err error) {
	for attempt := 1; attempt <= c.attempts; attempt++ {
		if err = reaperSoak(t, servers, c, attempt).verdict(c); err == nil {
			return nil
		}
		t.Logf("measurement %d: %v", attempt, err)
	}
	return fmt.Errorf("in all %d measurements: %w", c.attempts, err)
}

type soakConfig struct {
	rate     int           // new parents a minute
	parents  int           // how many in all
	drain    time.Duration // the longest wait for the last to go
	attempts int           // measurements at most
}

type soakResult struct {
	offered float64       // parents a minute, as made
	peak    int           // unreaped parents, highest of the once-a-second samples
	left    int           // unreaped when the drain wait ended
	drained time.Duration // from the last create to none left (or to giving up)
}

// verdict is nil when the reaper kept up: none left after the drain wait,
// at most 10 s of arrivals ever waiting, and the rate really offered.
func (r soakResult) verdict(c soakConfig) error {
	switch {
	case r.offered < 0.9*float64(c.rate):
		return fmt.Errorf("only %.0f new parents a minute offered of %d: the client fell behind, nothing is proved", r.offered, c.rate)
	case r.left > 0:
		return fmt.Errorf("%d of %d empty parents still there %v after the last was made", r.left, c.parents, c.drain)
	case r.peak > c.rate/6:
		return fmt.Errorf("%d empty parents waited at once, more than 10 s of arrivals (%d)", r.peak, c.rate/6)
	}
	return nil
}

// reaperSoak offers the server c.parents new key parents at c.rate a
// minute, from 4 sessions, and samples the unreaped ones every second.
// Each parent is made as zklock makes it, a container under the default
// root (itself a container under a container), and left as a lock's use
// leaves it: it had one child, an ephemeral node named as zklock's, and
// lost it. One multi (one transaction) does that for a batch of 25 keys;
// the child is not sequential, as a multi cannot name a sequential node it
// made. So the server's reaper, not the lock's Acquire, is what is
// measured. Measurement attempt (from 1) takes its own root beside the
// default one, and only the first warms the server up.
func reaperSoak(t *testing.T, servers []string, c soakConfig, attempt int) soakResult {
	const sessions = 4
	root := zklock.DefaultRoot
	if attempt > 1 {
		root += "-" + strconv.Itoa(attempt)
	}
	conns := make([]*zk.Conn, sessions+1) // the last samples
	for i := range conns {
		conns[i] = connect(t, servers)
	}
	sampler := conns[sessions]
	if err := makeContainers(sampler, root); err != nil {
		t.Fatal(err)
	}
	unreaped := func() (int, error) {
		ok, st, err := sampler.Exists(root)
		if err != nil || !ok { // the root goes too once empty
			return 0, err
		}
		return int(st.NumChildren), nil
	}

	// A warm-up under another root, unpaced and not measured: a fresh
	// JVM makes a few hundred parents a second for its first seconds.
	if attempt == 1 {
		warm := offer(conns[:sessions], "/warm", time.Now(), warmParents, 0)
		if err := warm(); err != nil {
			t.Fatalf("warm-up: %v", err)
		}
	}
	began := time.Now()
	wait := offer(conns[:sessions], root, began, c.parents, c.rate)
	done := make(chan struct{})
	var err error
	go func() { err = wait(); close(done) }()

	var r soakResult
	var samples []string
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
sample:
	for {
		select {
		case <-done:
			break sample
		case <-tick.C:
			n, err := unreaped()
			if err != nil {
				t.Fatalf("sample: %v", err)
			}
			r.peak = max(r.peak, n)
			samples = append(samples, strconv.Itoa(n))
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	made := time.Since(began)
	r.offered = float64(c.parents) / made.Minutes()
	last := time.Now()
	for ; ; time.Sleep(50 * time.Millisecond) {
		n, err := unreaped()
		if err != nil {
			t.Fatalf("drain: %v", err)
		}
		r.peak = max(r.peak, n)
		r.left, r.drained = n, time.Since(last)
		if n == 0 || r.drained > c.drain {
			break
		}
	}
	t.Logf("%d new key parents in %v: %.0f a minute offered; unreaped each second: %s; peak %d; %d left %v after the last",
		c.parents, made.Round(time.Millisecond), r.offered, strings.Join(samples, " "), r.peak, r.left, r.drained.Round(time.Millisecond))
	return r
}

// warmParents is how many the warm-up makes.
const warmParents = 3000

// offer makes n key parents under root, numbered from 0, from 8 workers
// per connection, in batches of 25 keys, each batch one multi; rate a
// minute paces them from began (0: as fast as they go). The function it
// returns waits for the last and returns the first error.
func offer(conns []*zk.Conn, root string, began time.Time, n, rate int) func() error {
	const (
		workers = 8
		batch   = 25
	)
	acl := zk.WorldACL(zk.PermAll)
	batches := int64((n + batch - 1) / batch)
	var every time.Duration
	if rate > 0 {
		every = time.Minute * batch / time.Duration(rate)
	}
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, len(conns)*workers)
	)
	for _, conn := range conns {
		for range workers {
			wg.Go(func() {
				for b := next.Add(1) - 1; b < batches; b = next.Add(1) - 1 {
					time.Sleep(time.Until(began.Add(time.Duration(b) * every)))
					var ops []any
					for k := b * batch; k < min((b+1)*batch, int64(n)); k++ {
						parent := fmt.Sprintf("%s/sku-%d", root, k)
						child := fmt.Sprintf("%s/_c_%032x-lock-0000000000", parent, k)
						ops = append(ops,
							&zk.CreateRequest{Path: parent, Flags: zk.FlagContainer, Acl: acl},
							&zk.CreateRequest{Path: child, Flags: zk.FlagEphemeral, Acl: acl},
							&zk.DeleteRequest{Path: child, Version: -1})
					}
					if err := multi(conn, root, ops); err != nil {
						errs <- fmt.Errorf("batch %d: %w", b, err)
						return
					}
				}
			})
		}
	}
	return func() error {
		wg.Wait()
		close(errs)
		return <-errs
	}
}

// multi runs ops as one transaction; when the root was reaped meanwhile
// (nothing under it for a check), it makes it again and retries, as
// zklock does. go-zookeeper v1.0.4 cannot decode a multi's result for a
// container create (type createContainer) and answers ErrAPIError once all
// ops succeeded; a failed multi answers an error result for every op,
// which it decodes, so ErrAPIError here means done.
func multi(c *zk.Conn, root string, ops []any) error {
	for try := 0; ; try++ {
		_, err := c.Multi(ops...)
		switch {
		case err == nil, errors.Is(err, zk.ErrAPIError):
			return nil
		case errors.Is(err, zk.ErrNoNode) && try < 5:
			if err := makeContainers(c, root); err != nil {
				return err
			}
		default:
			return err
		}
	}
}

// makeContainers makes path and its missing ancestors as containers.
func makeContainers(c *zk.Conn, path string) error {
	for i := 1; i <= len(path); i++ {
		if i < len(path) && path[i] != '/' {
			continue
		}
		_, err := c.CreateContainer(path[:i], nil, zk.FlagContainer, zk.WorldACL(zk.PermAll))
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// connect opens a session for the test's life.
func connect(t *testing.T, servers []string) *zk.Conn {
	t.Helper()
	c, events, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		for range events {
		}
	})
	for c.State() != zk.StateHasSession {
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return c
}
