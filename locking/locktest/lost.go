package locktest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
)

// The two ways a holder outlives its lease without dying, and the promise
// Lost makes for both: no check of Lost by the holder finds it open once a
// rival has been granted the key.

// lostWhenPaused pauses a holder process (SIGSTOP) until a rival is granted
// the key, then resumes it. The holder checks Lost every 5 ms and prints
// "alive <time>" while it is open, the time read before each check: a line
// stamped after the rival's grant is a holder that went on believing it
// held the lock. A Lost that closes only when a timer gets to run races
// the holder's first check after the pause.
func lostWhenPaused[C any](t *testing.T, b Backend[C], key string) {
	holder := startChild(t, request{Mode: "hold", Watch: true, Config: config(t, b), Key: key})
	if line, err := holder.expect("held"); err != nil {
		t.Fatalf("holder: %v (last line %q)", err, line)
	}
	lines := make(chan string, 1<<16)
	go func() {
		defer close(lines)
		for holder.lines.Scan() {
			lines <- holder.lines.Text()
		}
	}()
	rival := open(t, b)
	time.Sleep(100 * time.Millisecond) // a few checks before the pause
	proc := holder.cmd.Process
	defer proc.Signal(syscall.SIGCONT)
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), b.expiry()+10*time.Second)
	defer cancel()
	lease, err := rival.Acquire(ctx, key)
	granted := time.Now() // the grant came no later than this
	if err != nil {
		t.Fatalf("the rival was not granted the key of a holder paused %v: %v", time.Since(paused), err)
	}
	defer release(t, lease)
	if err := proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the holder checks again
	holder.stdin.Close()               // it releases (refused) and exits
	var (
		late   int
		latest time.Duration
		lostAt time.Time
	)
	for timeout := time.After(10 * time.Second); ; {
		var line string
		var ok bool
		select {
		case line, ok = <-lines:
		case <-timeout:
			t.Fatal("the holder did not end within 10s of its stdin closing")
		}
		if !ok {
			break
		}
		word, stamp, _ := strings.Cut(line, " ")
		ns, err := strconv.ParseInt(stamp, 10, 64)
		if err != nil {
			continue
		}
		at := time.Unix(0, ns)
		switch word {
		case "alive":
			if d := at.Sub(granted); d > 0 {
				late, latest = late+1, max(latest, d)
			}
		case "lost":
			lostAt = at
		}
	}
	if lostAt.IsZero() {
		t.Fatal("the holder's Lost never closed")
	}
	t.Logf("%s: holder paused %v until a rival's grant; its Lost closed %v after the grant (it was paused meanwhile)",
		b.Name, granted.Sub(paused).Round(time.Millisecond), lostAt.Sub(granted).Round(time.Millisecond))
	if late > 0 {
		t.Errorf("the resumed holder found Lost open %d times after a rival was granted the key (up to %v after)", late, latest)
	}
}

// lostWhenDelayed opens the holder through a proxy to each server and,
// once it holds the key, delays everything on that path by twice the TTL:
// its renewals arrive after the server has expired its lease, and a rival,
// which reaches the servers directly, is granted the key. The holder is
// running all along, so its first look at Lost after that grant must find
// it closed (Lost reads the clock: no goroutine needs to have run).
func lostWhenDelayed[C any](t *testing.T, b Backend[C], key string) {
	proxies := make(testbed.Proxies, len(b.Servers))
	addrs := make([]string, len(b.Servers))
	for i, upstream := range b.Servers {
		p, err := testbed.StartProxy(fmt.Sprintf("server%d", i), upstream)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		proxies[i], addrs[i] = p, p.Addr()
	}
	pb := b
	pb.Config = b.Through(addrs)
	holder := open(t, pb)
	lease, err := holder.Acquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	delay := 2 * b.expiry()
	if err := proxies.Latency(delay); err != nil {
		t.Fatal(err)
	}
	delayed := time.Now()
	rival := open(t, b)
	ctx, cancel := context.WithTimeout(t.Context(), b.expiry()+10*time.Second)
	defer cancel()
	won, err := rival.Acquire(ctx, key)
	granted := time.Now() // the grant came no later than this
	if err != nil {
		t.Fatalf("the rival was not granted the key of a holder delayed by %v: %v", delay, err)
	}
	defer release(t, won)
	// The holder's first look after the grant: Lost reads the clock, so
	// it must be closed now, whatever goroutine was due to close it.
	select {
	case <-lease.Lost():
		t.Logf("%s: with renewals delayed by %v, the holder's Lost was closed when a rival was granted the key %v after the delay began",
			b.Name, delay, granted.Sub(delayed).Round(time.Millisecond))
	default:
		t.Errorf("the holder's Lost is still open after a rival was granted the key")
	}
	proxies.Restore()
	// Refused, or not: the lease is lost either way; the rival's holds.
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if err := lease.Release(rctx); err == nil {
		t.Errorf("a lease lost to a rival released without error")
	}
}

// watchLost prints "alive <unix ns>" every 5 ms while lease's Lost is open
// (the time read before the check), then "lost <unix ns>", until stop.
func watchLost(lease locking.Lease, stop <-chan struct{}) {
	for {
		now := time.Now()
		select {
		case <-lease.Lost():
			fmt.Printf("lost %d\n", time.Now().UnixNano())
			return
		default:
			fmt.Printf("alive %d\n", now.UnixNano())
		}
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}
