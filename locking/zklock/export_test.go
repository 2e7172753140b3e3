package zklock

// SessionID is the Locker's session, for the tests that read the server's
// per-connection figures.
func (l *Locker) SessionID() int64 { return l.conn.SessionID() }
