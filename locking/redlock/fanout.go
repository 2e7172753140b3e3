package redlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// Vote is one node's answer to one request.
type Vote struct {
	Yes    bool
	Holder string        // a refused acquire: the holder's owner there, if known,
	PTTL   time.Duration // and its remaining TTL (-1: unknown)
	Err    error
}

// Request is one request to every node (or to every node i with Only(i)).
type Request struct {
	Ctx  context.Context // the caller's: Ask returns when it ends
	Base context.Context // the requests', each bounded by Timeout and by Close
	// Timeout bounds each node's request, counted from its start: at once,
	// or once After[i] is closed.
	Timeout time.Duration
	Only    func(i int) bool // nil: every node
	// After, if set, holds per node a channel closed once an earlier
	// request there has ended: this one is sent after it, so that an undo
	// cannot overtake the acquire it undoes (they travel on different
	// connections).
	After []<-chan struct{}
	// Decided tells from the answers so far whether the outcome is settled
	// (a majority said yes, or too many refused for one to): a Fanout may
	// return then. Hurry marks an acquire attempt, which can be tried again.
	Decided func(Tally) bool
	Hurry   bool
	Do      func(ctx context.Context, i int) Vote // node i's request

	n    int             // the number of nodes
	stop context.Context // ends at Close
}

// Fanout gathers the answers to a Request sent to every node. The default,
// WaitAll, waits for every node; locking/redlock/quorum returns as soon as
// a majority's answers settle the outcome.
type Fanout interface {
	// Ask returns the answers in node order; a node not waited for reads
	// "no answer yet". done holds per node a channel closed once its
	// request has ended (at once for a node not asked).
	Ask(r Request) (votes []Vote, done []<-chan struct{})
}

// Sent is a Request under way.
type Sent struct {
	Answers <-chan Answer // one per node asked, as they come
	Votes   []Vote        // "no answer yet" for every node asked
	Done    []<-chan struct{}
	Asked   int
}

// Answer is node I's vote.
type Answer struct {
	I    int
	Vote Vote
}

// Send starts r on the nodes at once, each request in its own goroutine.
func Send(r Request) Sent {
	n := r.n
	s := Sent{Votes: make([]Vote, n), Done: make([]<-chan struct{}, n)}
	answers := make(chan Answer, n)
	s.Answers = answers
	for i := range n {
		if r.Only != nil && !r.Only(i) {
			s.Done[i] = closed
			continue
		}
		s.Asked++
		s.Votes[i] = Vote{Err: fmt.Errorf("node %d: %w", i, errNoAnswer)}
		ended := make(chan struct{})
		s.Done[i] = ended
		go func() {
			defer close(ended)
			if r.After != nil && r.After[i] != nil {
				// The earlier request ends at its own timeout: the wait is
				// bounded, and this request's time starts after it.
				select {
				case <-r.After[i]:
				case <-r.Base.Done():
				case <-r.stop.Done():
				}
			}
			ctx, cancel := context.WithTimeout(r.Base, r.Timeout)
			defer cancel()
			defer context.AfterFunc(r.stop, cancel)()
			v := Vote{Err: ctx.Err()}
			if v.Err == nil {
				v = r.Do(ctx, i)
			}
			answers <- Answer{i, v} // buffered: never blocks
		}()
	}
	return s
}

// WaitAll is the default Fanout: it waits for every node's answer (each
// bounded by the request's timeout), or for the caller's ctx to end.
type WaitAll struct{}

func (WaitAll) Ask(r Request) ([]Vote, []<-chan struct{}) {
	s := Send(r)
	for range s.Asked {
		select {
		case a := <-s.Answers:
			s.Votes[a.I] = a.Vote
		case <-r.Ctx.Done():
			return s.Votes, s.Done
		}
	}
	return s.Votes, s.Done
}

// closed is a closed channel: a request with nothing to wait for.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// both returns a channel closed once a and b are (nil counts as closed).
func both(a, b <-chan struct{}) <-chan struct{} {
	switch {
	case a == nil || isDone(a):
		return b
	case b == nil || isDone(b):
		return a
	}
	c := make(chan struct{})
	go func() {
		<-a
		<-b
		close(c)
	}()
	return c
}

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// errNoAnswer marks a node whose answer was not waited for.
var errNoAnswer = errors.New("no answer yet")

// Tally counts the answers to one request.
type Tally struct {
	Yes, No, Failed int
	Down            int // failed, and not merely slow: refused, reset
	Pending         int // not waited for (see Fanout)
	Errs            NodeErrors
}

// NodeErrors are the failures of several nodes, on one line.
type NodeErrors []error

func (e NodeErrors) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (e NodeErrors) Unwrap() []error { return e }

// Count tallies votes.
func Count(votes []Vote) Tally {
	var t Tally
	for _, v := range votes {
		switch {
		case errors.Is(v.Err, errNoAnswer):
			t.Pending++
			t.Errs = append(t.Errs, v.Err)
		case v.Err != nil:
			t.Failed++
			t.Errs = append(t.Errs, v.Err)
			if !isTimeout(v.Err) {
				t.Down++
			}
		case v.Yes:
			t.Yes++
		default:
			t.No++
		}
	}
	return t
}

func isTimeout(err error) bool {
	var nerr net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &nerr) && nerr.Timeout()
}
