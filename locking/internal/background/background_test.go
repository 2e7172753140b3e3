package background

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Pure logic: no server is involved.

func TestRemoveRetriesUntilGone(t *testing.T) {
	g := New()
	defer g.Wait()
	defer g.Close()
	calls := 0
	g.Remove(func() bool { calls++; return calls == 4 })
	if calls != 4 {
		t.Errorf("try called %d times, want until it reports gone (4)", calls)
	}
}

func TestRemoveEndsWithClose(t *testing.T) {
	g := New()
	ended := make(chan struct{})
	if !g.Go(func() { g.Remove(func() bool { return false }); close(ended) }) {
		t.Fatal("Go refused on an open group")
	}
	time.Sleep(50 * time.Millisecond)
	g.Close()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("Remove still retrying 5s after Close")
	}
	g.Wait()
	if g.Go(func() { t.Error("ran after Close") }) {
		t.Error("Go accepted work after Close")
	}
}

func TestSleep(t *testing.T) {
	g := New()
	defer g.Close()
	if !g.Sleep(context.Background(), time.Millisecond) {
		t.Error("Sleep cut short with nothing ending")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if g.Sleep(ctx, time.Minute) {
		t.Error("Sleep ran on past its ctx")
	}
	g.Close()
	if g.Sleep(context.Background(), time.Minute) {
		t.Error("Sleep ran on past Close")
	}
}

func TestBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{0: 25 * time.Millisecond, 2: 100 * time.Millisecond, 10: time.Second} {
		for range 20 {
			if d := Backoff(n); d < want/2 || d >= want {
				t.Errorf("Backoff(%d) = %v, want in [%v, %v)", n, d, want/2, want)
			}
		}
	}
}

// goid is the running goroutine's id, from its stack header.
func goid() string {
	var b [64]byte
	f := strings.Fields(string(b[:runtime.Stack(b[:], false)]))
	return f[1] // "goroutine N [running]:"
}

// Work handed over one piece at a time runs on a goroutine that finished
// the last one: a new goroutine per piece would pay its start and stack
// growth each time.
func TestGoReusesAFinishedGoroutine(t *testing.T) {
	g := New()
	defer g.Wait()
	defer g.Close()
	const n = 20
	ids := map[string]bool{}
	for range n {
		done := make(chan string)
		if !g.Go(func() { done <- goid() }) {
			t.Fatal("Go refused on an open group")
		}
		ids[<-done] = true
		time.Sleep(time.Millisecond) // lets it reach its wait for more
	}
	if len(ids) > n/2 {
		t.Errorf("%d pieces of work ran on %d goroutines, want them reused", n, len(ids))
	}
}

// A goroutine with nothing more to do ends by itself after linger, and at
// once when the Group closes: Wait returns.
func TestIdleGoroutineEnds(t *testing.T) {
	before := runtime.NumGoroutine()
	g := New()
	defer g.Close()
	g.Go(func() {})
	deadline := time.Now().Add(linger + 5*time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines %v after the work ended, want %d", n, linger+5*time.Second, before)
	}
	g.Go(func() {})
	g.Close()
	g.Wait() // hangs past the test timeout if Close left it waiting
}
