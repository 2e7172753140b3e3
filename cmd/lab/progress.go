package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oversold-lab/oversold/loadtest"
)

// progress draws one run's live progress on stderr: a bar redrawn about five
// times a second on a terminal, a plain line now and then otherwise (CI logs).
type progress struct {
	w     io.Writer
	tty   bool
	label string // "[3/8] redis/none"
	total int

	done    atomic.Int64
	started atomic.Int64 // unix nanos of the first request finished; 0 before
	phase   atomic.Value // string: what the run is doing when not under load

	stop chan struct{}
	wg   sync.WaitGroup
}

const (
	redrawTTY   = 200 * time.Millisecond
	redrawPlain = time.Second
	barWidth    = 24
)

func startProgress(w io.Writer, tty bool, label string, total int) *progress {
	p := &progress{w: w, tty: tty, label: label, total: total, stop: make(chan struct{})}
	p.phase.Store("starting replicas")
	every := redrawPlain
	if tty {
		every = redrawTTY
	}
	p.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		last := ""
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
				if line := p.line(); line != last {
					p.draw(line)
					last = line
				}
			}
		}
	})
	return p
}

// set records requests done; the attack calls it after every answer.
func (p *progress) set(done int) {
	if p.started.Load() == 0 {
		p.started.CompareAndSwap(0, time.Now().UnixNano())
	}
	p.done.Store(int64(done))
	if done == p.total {
		p.phase.Store("checking")
	}
}

// finish stops redrawing and leaves the run's result on its own line.
func (p *progress) finish(r loadtest.Result, took time.Duration) {
	close(p.stop)
	p.wg.Wait()
	line := fmt.Sprintf("%-22s %4d/%d %4.0f/s  %s in %s", p.label, p.done.Load(), p.total,
		r.ThroughputRPS, r.Verdict(), took.Round(100*time.Millisecond))
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s\n", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

func (p *progress) line() string {
	done := p.done.Load()
	if done == 0 || done == int64(p.total) {
		return fmt.Sprintf("%-22s %s…", p.label, p.phase.Load())
	}
	if !p.tty {
		return fmt.Sprintf("%-22s %s", p.label, p.counts())
	}
	filled := int(done) * barWidth / p.total
	bar := strings.Repeat("█", filled) + strings.Repeat("░", barWidth-filled)
	return fmt.Sprintf("%-22s %s %s", p.label, bar, p.counts())
}

// counts is "412/600 298/s".
func (p *progress) counts() string {
	done := p.done.Load()
	rate := 0.0
	if start := p.started.Load(); start != 0 {
		if secs := time.Since(time.Unix(0, start)).Seconds(); secs > 0 {
			rate = float64(done) / secs
		}
	}
	return fmt.Sprintf("%4d/%d %4.0f/s", done, p.total, rate)
}

func (p *progress) draw(line string) {
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

// isTerminal reports whether f is a character device: a terminal, not a pipe
// or a file.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
