package order

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Coalescing: orders for one SKU that reach a replica while its lock is
// held or being acquired wait in the SKU's queue. One goroutine per busy
// SKU (drain) acquires the lock, takes what queued (at most
// Config.BatchMax orders, after Config.BatchWait if set), sells it in one
// transaction (sell), releases, and goes on while orders wait. The idea is
// kernel group commit on a hot row, one level up: the lock and the row are
// paid once per batch instead of once per order.

const (
	// DefaultBatchMax is Config.BatchMax's default: enough to amortise a
	// lock round trip and a commit, small enough that one INSERT stays far
	// below max_allowed_packet.
	DefaultBatchMax = 64
)

// pending is one order waiting for its SKU's next batch.
type pending struct {
	line     // its request, and its answer once sold
	ctx      context.Context
	deadline time.Time    // past it, the order gives up: lock_timeout
	done     chan outcome // buffered: the drain never waits for a client
}

// queues holds, per SKU being drained, the orders waiting. A SKU present in
// the map has a drain running, even with an empty queue.
type queues struct {
	mu sync.Mutex
	m  map[string][]*pending
}

// enqueue puts req in its SKU's queue, starting the SKU's drain if none
// runs, and waits for its outcome. A client that leaves while its order
// queues takes the order out, and nothing of it is written. Once a batch
// has taken it, the order is written or not with the batch, and the
// answer waits for that outcome (bounded by the batch's own bounds): a
// 503 after a commit would tell the client to buy again.
func (s *Service) enqueue(ctx context.Context, req Request) (Order, bool, error) {
	p := &pending{line: line{req: req}, ctx: ctx, deadline: time.Now().Add(s.cfg.LockWait), done: make(chan outcome, 1)}
	s.queues.mu.Lock()
	q, running := s.queues.m[req.SKU]
	s.queues.m[req.SKU] = append(q, p)
	s.queues.mu.Unlock()
	if !running {
		go s.drain(req.SKU)
	}
	var r outcome
	select {
	case r = <-p.done:
	case <-ctx.Done():
		if s.leave(p) {
			return Order{}, false, ctx.Err()
		}
		r = <-p.done // taken (or answered) already
	}
	return r.order, r.replayed, r.err
}

// leave takes p out of its SKU's queue and reports whether it was there:
// false once a batch has taken it.
func (s *Service) leave(p *pending) bool {
	s.queues.mu.Lock()
	defer s.queues.mu.Unlock()
	q := s.queues.m[p.req.SKU]
	if i := slices.Index(q, p); i >= 0 {
		s.queues.m[p.req.SKU] = slices.Delete(q, i, i+1)
		return true
	}
	return false
}

// drain sells the SKU's queue, batch after batch, until it is empty.
func (s *Service) drain(sku string) {
	for s.waiting(sku) {
		// 2. the lock, for whatever queues until it is granted. The wait
		// is the replica's, not one client's: bounded by LockWait.
		lease, err := s.acquire(context.Background(), sku) // bounded by LockWait
		if err != nil {
			for _, p := range s.take(sku, -1) {
				p.done <- outcome{err: err}
			}
			continue
		}
		held := s.hold(lease)
		if s.cfg.BatchWait > 0 {
			time.Sleep(s.cfg.BatchWait)
		}
		batch := s.take(sku, s.cfg.BatchMax)
		if len(batch) > 0 {
			s.metrics.batchSize.Observe(float64(len(batch)))
			lines := make([]*line, len(batch))
			for i, p := range batch {
				lines[i] = &p.line
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), s.batchBound(len(batch)))
			s.sell(ctx, lease, lines, false)
			cancel()
		}
		// 8. release, after the commit and before the answers: a client
		// that has its answer finds the lock free, as without batching.
		s.release(context.Background(), lease, held)
		for _, p := range batch {
			p.done <- s.result(&p.line)
		}
	}
}

// batchBound is the time a batch of n orders has for its reads and work,
// retries included; sell starts no write past it. Each order's work delay
// is paid inside the batch: the bound grows with it, or a large batch
// would time out as a whole.
func (s *Service) batchBound(n int) time.Duration {
	return writeTimeout + time.Duration(n)*s.cfg.WorkDelay
}

// answerSlack is the margin of WriteTimeout over the sum of the bounds it
// counts: scheduling on a loaded machine, encoding the answer.
const answerSlack = 5 * time.Second

// WriteTimeout is the time from a request's headers to its answer's last
// byte that the server running the handler must allow
// (http.Server.WriteTimeout, as cmd/orderd sets it, and its graceful
// shutdown waits as long): a connection closed sooner could lose the
// answer of an order that committed, and a client without a key would
// buy again. It is the sum of what may come in turn: the body's read
// (ReadTimeout), the request's time (RequestTimeout; a queued order that
// reaches it leaves its queue, unwritten), and once a batch has taken
// the order its whole bound: reads and work (batchBound of BatchMax
// orders, retries included), the last write begun within it
// (writeTimeout), its settling (refused: afterCommitTimeout), the release
// (afterCommitTimeout). A batch of BatchMax orders of WorkDelay each
// therefore lengthens it by BatchMax·WorkDelay.
func (s *Service) WriteTimeout() time.Duration {
	return s.ReadTimeout() + s.cfg.RequestTimeout +
		s.batchBound(s.cfg.BatchMax) + writeTimeout + 2*afterCommitTimeout + answerSlack
}

// result is the line's answer once sell has run. A line left with
// neither an order nor an error is a bug in sell, and is never sent as a
// sale: it is logged as one and answered as an unanticipated failure.
func (s *Service) result(l *line) outcome {
	if !l.answered() {
		s.log.Error("order left unanswered by its batch", "sku", l.req.SKU, "key", l.req.Key)
		return outcome{err: errUnanswered}
	}
	return l.out
}

// errUnanswered is the answer of an order its batch left unanswered.
var errUnanswered = errors.New("the batch left the order unanswered")

// waiting reports whether orders wait for sku, and ends the drain (removes
// the SKU) when none do.
func (s *Service) waiting(sku string) bool {
	s.queues.mu.Lock()
	defer s.queues.mu.Unlock()
	if len(s.queues.m[sku]) > 0 {
		return true
	}
	delete(s.queues.m, sku)
	return false
}

// take removes up to max orders (all: max < 0) from the front of the SKU's
// queue and returns those still wanted. A client that left, or waited past
// its deadline, is answered here and sold nothing. An order under a key
// already in the batch stays queued for the next one, where it meets the
// first as a replay (or a reuse).
func (s *Service) take(sku string, max int) []*pending {
	s.queues.mu.Lock()
	q := s.queues.m[sku]
	var batch, rest []*pending
	keys := map[string]bool{}
	now := time.Now()
	for _, p := range q {
		switch {
		case max >= 0 && len(batch) >= max:
			rest = append(rest, p)
		case p.req.Key != "" && keys[p.req.Key]:
			rest = append(rest, p)
		case p.ctx.Err() != nil:
			p.done <- outcome{err: p.ctx.Err()}
		case now.After(p.deadline):
			p.done <- outcome{err: fmt.Errorf("%w: queued past %v", ErrLockTimeout, s.cfg.LockWait)}
		default:
			keys[p.req.Key] = p.req.Key != ""
			batch = append(batch, p)
		}
	}
	s.queues.m[sku] = rest
	s.queues.mu.Unlock()
	return batch
}
