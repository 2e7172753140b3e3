package etcdlock

// AfterGrant makes l call f between granting a session and publishing it.
func AfterGrant(l *Locker, f func()) { l.afterGrant = f }

// WatchingSession makes l call f as the watcher of each session granted
// from now on starts.
func WatchingSession(l *Locker, f func()) { l.watching = f }

// Closing reports whether Close has begun.
func Closing(l *Locker) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// LoseSession marks l's current session lost, as a renewal that failed
// past its validity would; the server keeps it until its TTL.
func LoseSession(l *Locker) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sess.ka.MarkLost()
}

// CloseTimeout bounds Close's revokes.
const CloseTimeout = closeTimeout

// BeforeWatch makes l call f when a waiter has found its predecessor and
// is about to watch it.
func BeforeWatch(l *Locker, f func()) { l.beforeWatch = f }

// NameEntries counts the queue prefixes whose names l's current session
// keeps.
func NameEntries(l *Locker) int {
	l.mu.Lock()
	s := l.sess
	l.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.names)
}

// SameFloor reports whether keys a and b share a floor in l's current
// session.
func SameFloor(l *Locker, a, b string) bool {
	l.mu.Lock()
	s := l.sess
	l.mu.Unlock()
	return s.floor(l.queue(a)) == s.floor(l.queue(b))
}
