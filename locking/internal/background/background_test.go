package background

import (
	"context"
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
