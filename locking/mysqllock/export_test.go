package mysqllock

// Closed says whether Close has begun.
func Closed(l *Locker) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}
