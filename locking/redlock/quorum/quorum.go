// Package quorum is a redlock.Fanout that returns as soon as the answers
// in settle the outcome (a majority said yes, or too many refused for one
// to), instead of waiting for every node: a black-holed or slow minority
// then costs an Acquire, a renewal or a Release nothing. The nodes yet to
// answer read "no answer yet" and their requests go on in the background,
// bounded by their timeout and by Close, so a renewal still reaches the
// slower nodes.
//
// An acquire attempt whose majority answered without settling the outcome
// waits for the nodes known slow (the last request there ran out its
// timeout unanswered) only as long again as that majority took: a retry
// does not wait out a black-holed node each time, yet still hears a healthy
// node a few ms farther whose vote decides.
package quorum

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/locking/redlock"
)

// Hurry is the Fanout; one per Locker, as it remembers which nodes are slow.
type Hurry struct {
	quorum int
	// slow: the node's last request ran out its timeout unanswered (black-
	// holed, or far slower than the rest). Any answer clears it.
	slow []atomic.Bool
}

// New returns the Fanout of a Locker on n nodes.
func New(n int) *Hurry {
	return &Hurry{quorum: n/2 + 1, slow: make([]atomic.Bool, n)}
}

// Ask returns the answers as soon as r.Decided settles the outcome, every
// node asked has answered, r.Ctx ends, or an attempt's grace for the slow
// nodes is over.
func (h *Hurry) Ask(r redlock.Request) ([]redlock.Vote, []<-chan struct{}) {
	do := r.Do
	r.Do = func(ctx context.Context, i int) redlock.Vote {
		v := do(ctx, i)
		var reply redis.Error
		switch {
		case v.Err == nil, errors.As(v.Err, &reply):
			h.slow[i].Store(false)
		case errors.Is(ctx.Err(), context.DeadlineExceeded) && r.Base.Err() == nil:
			h.slow[i].Store(true)
		}
		return v
	}
	s := redlock.Send(r)
	start, answered := time.Now(), 0
	in := make([]bool, len(s.Votes))
	// onlySlowLeft: every node yet to answer ran out its last timeout.
	onlySlowLeft := func() bool {
		for i := range h.slow {
			if (r.Only == nil || r.Only(i)) && !in[i] && !h.slow[i].Load() {
				return false
			}
		}
		return true
	}
	var grace <-chan time.Time
	for answered < s.Asked && (r.Decided == nil || !r.Decided(redlock.Count(s.Votes))) {
		select {
		case a := <-s.Answers:
			s.Votes[a.I], in[a.I] = a.Vote, true
			if answered++; r.Hurry && grace == nil && answered >= h.quorum && answered < s.Asked && onlySlowLeft() {
				grace = time.After(max(time.Since(start), time.Millisecond))
			}
		case <-grace:
			return s.Votes, s.Done
		case <-r.Ctx.Done():
			return s.Votes, s.Done
		}
	}
	return s.Votes, s.Done
}
