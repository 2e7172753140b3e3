package zklock

// Escape is the key-to-node-name mapping, for the tests' Steal and Leftovers.
var Escape = escape

// SessionID is the Locker's session, for the tests that read the server's
// per-connection figures.
func (l *Locker) SessionID() int64 { return l.conn.SessionID() }
