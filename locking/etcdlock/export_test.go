package etcdlock

// AfterGrant makes l call f between granting a session and publishing it.
func AfterGrant(l *Locker, f func()) { l.afterGrant = f }

// Closing reports whether Close has begun.
func Closing(l *Locker) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// CloseTimeout bounds Close's revoke.
const CloseTimeout = closeTimeout
