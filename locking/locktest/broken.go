package locktest

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking"
)

// brokenEnv names the broken variant a conformance run is asked to test.
const brokenEnv = "OVERSOLD_LOCKTEST_BROKEN"

// The broken variants the suite applies itself, by wrapping every Locker it
// opens in the test process. A backend adds its own (a bare DEL release
// script) by reading Broken in its TestConformance.
const (
	RepeatingToken  = "repeating-token"   // every grant has token 1
	IgnoringCtx     = "ignoring-ctx"      // Acquire waits on, whatever its ctx
	LostNeverCloses = "lost-never-closes" // Lost is a channel nobody closes
	ReleaseByKey    = "release-by-key"    // Release frees the key's latest grant, whoever holds it
	LeakingTimer    = "leaking-timer"     // every grant starts a timer nobody stops
)

// Broken returns the broken variant this run tests, or "" for a real run.
func Broken() string { return os.Getenv(brokenEnv) }

// breakLocker wraps l in the broken variant this run tests, if the suite
// implements it.
func breakLocker(l locking.Locker) locking.Locker {
	var acquire func(ctx context.Context, key string) (locking.Lease, error)
	switch Broken() {
	case RepeatingToken:
		acquire = func(ctx context.Context, key string) (locking.Lease, error) {
			lease, err := l.Acquire(ctx, key)
			if err != nil {
				return nil, err
			}
			return fixedToken{lease}, nil
		}
	case IgnoringCtx:
		acquire = func(ctx context.Context, key string) (locking.Lease, error) {
			return l.Acquire(context.WithoutCancel(ctx), key)
		}
	case LostNeverCloses:
		acquire = func(ctx context.Context, key string) (locking.Lease, error) {
			lease, err := l.Acquire(ctx, key)
			if err != nil {
				return nil, err
			}
			return neverLost{lease}, nil
		}
	case ReleaseByKey:
		acquire = func(ctx context.Context, key string) (locking.Lease, error) {
			lease, err := l.Acquire(ctx, key)
			if err != nil {
				return nil, err
			}
			latest.Lock()
			latest.byKey[key] = lease
			latest.Unlock()
			return byKey{lease}, nil
		}
	case LeakingTimer:
		acquire = func(ctx context.Context, key string) (locking.Lease, error) {
			lease, err := l.Acquire(ctx, key)
			if err == nil {
				// A renewal or fallback timer that Release forgets to
				// stop: pending for an hour, so held by the runtime.
				time.AfterFunc(time.Hour, func() {})
			}
			return lease, err
		}
	default:
		return l
	}
	return brokenLocker{Locker: l, acquire: acquire}
}

type brokenLocker struct {
	locking.Locker
	acquire func(ctx context.Context, key string) (locking.Lease, error)
}

func (b brokenLocker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	return b.acquire(ctx, key)
}

type fixedToken struct{ locking.Lease }

func (fixedToken) Token() uint64 { return 1 }

type neverLost struct{ locking.Lease }

func (neverLost) Lost() <-chan struct{} { return nil }

// latest is the last lease granted on each key, across all Lockers, as a
// server that knows keys but not owners would see it.
var latest = struct {
	sync.Mutex
	byKey map[string]locking.Lease
}{byKey: map[string]locking.Lease{}}

type byKey struct{ locking.Lease }

func (b byKey) Release(ctx context.Context) error {
	latest.Lock()
	current := latest.byKey[b.Key()]
	latest.Unlock()
	return current.Release(ctx)
}

// Teeth proves that the suite fails on each broken promise: for each
// variant it runs this test binary's TestConformance again with that
// variant, and checks that the run fails, first in the subtest named by
// variants[variant] (the one that checks the promise the variant breaks).
// A package calls it from a test of its own:
//
//	func TestSuiteTeeth(t *testing.T) {
//		locktest.Teeth(t, map[string]string{locktest.IgnoringCtx: "WaitDeadline", ...})
//	}
func Teeth(t *testing.T, variants map[string]string) {
	if Broken() != "" {
		t.Skip("a run of a broken variant does not test the suite")
	}
	for variant, want := range variants {
		t.Run(variant, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0],
				"-test.run=^TestConformance$", "-test.failfast", "-test.v", "-test.count=1", "-test.timeout=3m")
			cmd.Env = append(os.Environ(), brokenEnv+"="+variant)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a Locker broken by %s", variant)
			}
			first := firstFailure(out)
			if first != want {
				t.Fatalf("the suite failed %s first in %q, want %q; output:\n%s", variant, first, want, tail(out, 4000))
			}
			t.Logf("%s: the suite failed in %s", variant, first)
		})
	}
}

// firstFailure returns the name of the first conformance subtest that
// failed in go test -v output.
func firstFailure(out []byte) string {
	const mark = "--- FAIL: TestConformance/"
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, mark); ok {
			name, _, _ := strings.Cut(rest, " ")
			return name
		}
	}
	return ""
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
