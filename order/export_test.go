package order

import (
	"context"
	"time"
)

// Queued is how many orders wait in sku's queue on s: tests send orders
// one after another once the one before has queued, so that they arrive
// in a known order however late a goroutine is scheduled.
func Queued(s *Service, sku string) int {
	s.queues.mu.Lock()
	defer s.queues.mu.Unlock()
	return len(s.queues.m[sku])
}

// Draining reports whether a drain runs for sku on s: a batch may still be
// writing.
func Draining(s *Service, sku string) bool {
	s.queues.mu.Lock()
	defer s.queues.mu.Unlock()
	_, ok := s.queues.m[sku]
	return ok
}

// GateBound is how long a take is left to its flow before the back-check.
func GateBound(s *Service) time.Duration { return s.gateBound() }

// Work is how long the business logic of a batch of n orders takes on s,
// under a lock or without.
func Work(s *Service, locked bool, n int) time.Duration { return s.work(locked, n) }

// GateKeys is the sweeper's pass over the gate's key set: loaded if it is
// incomplete, or due to be loaded again.
func GateKeys(s *Service) { s.gateKeys(context.Background(), true) }
