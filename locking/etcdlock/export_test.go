package etcdlock

// AfterGrant makes l call f between granting a session and publishing it.
func AfterGrant(l *Locker, f func()) { l.afterGrant = f }
