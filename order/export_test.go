package order

// Queued is how many orders wait in sku's queue on s: tests send orders
// one after another once the one before has queued, so that they arrive
// in a known order however late a goroutine is scheduled.
func Queued(s *Service, sku string) int {
	s.queues.mu.Lock()
	defer s.queues.mu.Unlock()
	return len(s.queues.m[sku])
}
