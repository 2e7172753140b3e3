package fairwake

import (
	"context"
	mrand "math/rand/v2"
	"reflect"
	"slices"
	"time"

	"github.com/oversold-lab/oversold/locking/internal/waitq"
	"github.com/oversold-lab/oversold/locking/redlock"
)

// Next waits until the next try is due, after a try that got votes.
func (w *wait) Next(ctx context.Context, attempt int, votes []redlock.Vote, elapsed time.Duration) error {
	cfg, t := w.cfg, tallyOf(votes)
	if t.yes > 0 {
		// Our key got some nodes, not a majority, and is gone again: a
		// split vote (contenders each got some nodes), or a holder whose
		// release reached some nodes first. Pause for a random while so
		// that the contenders do not meet again (the Redlock
		// description's advice), longer with every split in a row;
		// messages wait in wake meanwhile. Then retry after a split, or
		// wait for the holder's release as usual.
		held := t.held(w.quorum)
		if w.splits++; held {
			w.splits = 0
		}
		// The pause grows from the time of one attempt: a pause much
		// longer than the attempts that split leaves the lock idle.
		w.timer.Reset(mrand.N(min(cfg.MaxBackoff, max(elapsed, time.Millisecond)<<min(w.splits, 20))) + 1)
		if _, err := w.wait(ctx, nil); err != nil || !held {
			return err
		}
	} else {
		w.splits = 0
	}
	w.timer.Reset(waitq.Backoff(cfg.MinBackoff, cfg.MaxBackoff, attempt, t.freeIn(w.quorum)))
	if w.Listening() < len(votes) {
		// Subscribe on every node, and try again once a majority
		// confirms (or the delay ends): a release between the first try
		// and the subscriptions is not lost. Not all: a node down or
		// black-holed never confirms.
		_, err := w.confirmed(ctx, w.Subscribe(), w.quorum)
		return err // or the timer fired
	}
	if ok, err := w.wait(ctx, w.Wake); !ok {
		return err
	}
	// A release reaches the nodes one by one, and each node whose queue
	// has us first tells us. Try once a majority has told us, so that we
	// try once per release, not once per node, and not before the release
	// reached enough nodes; or after the time of one attempt, if the
	// nodes woke different waiters or some message is late.
	w.timer.Reset(min(elapsed, cfg.NodeTimeout))
	for heard := 1; heard < w.quorum; heard++ {
		ok, err := w.wait(ctx, w.Wake)
		if err != nil {
			return err
		}
		if !ok {
			break // the timer fired
		}
	}
	w.timer.Stop()
	w.Drain()
	return nil
}

// confirmed waits until k of the ready channels are closed (ok), the timer
// fires, or ctx or the Locker ends (an error).
func (w *wait) confirmed(ctx context.Context, ready []<-chan struct{}, k int) (ok bool, err error) {
	cases := []reflect.SelectCase{
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.timer.C)},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.closing)},
	}
	for _, r := range ready {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(r)})
	}
	for ; k > 0; k-- {
		switch i, _, _ := reflect.Select(cases); i {
		case 0:
			return false, nil
		case 1:
			return false, ctx.Err()
		case 2:
			return false, redlock.ErrClosed
		default:
			cases[i].Chan = reflect.Value{} // closed: Select ignores it now
		}
	}
	return true, nil
}

// wait waits for c (ok), the timer, or the end of ctx or of the Locker (an
// error).
func (w *wait) wait(ctx context.Context, c <-chan struct{}) (ok bool, err error) {
	select {
	case <-c:
		return true, nil
	case <-w.timer.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	case <-w.closing:
		return false, redlock.ErrClosed
	}
}

// tally is what Next reads in an attempt's votes.
type tally struct {
	yes     int
	holders map[string]int  // refusals per holder
	pttls   []time.Duration // of the refusals with a TTL
}

func tallyOf(votes []redlock.Vote) tally {
	t := tally{holders: make(map[string]int)}
	for _, v := range votes {
		switch {
		case v.Err != nil:
		case v.Yes:
			t.yes++
		default:
			t.holders[v.Holder]++
			if v.PTTL >= 0 {
				t.pttls = append(t.pttls, v.PTTL)
			}
		}
	}
	return t
}

// held reports whether someone holds the lock on a majority.
func (t tally) held(quorum int) bool {
	for _, n := range t.holders {
		if n >= quorum {
			return true
		}
	}
	return false
}

// freeIn is how long until enough holders' keys expire for a majority to
// be free, counting the nodes that said yes as free; negative if unknown.
func (t tally) freeIn(quorum int) time.Duration {
	need := quorum - t.yes
	if need <= 0 {
		return 0
	}
	if need > len(t.pttls) {
		return -1
	}
	slices.Sort(t.pttls)
	return t.pttls[need-1]
}
