package storage

// SetMaxConns sizes the connection pool to at most n connections open to
// MySQL (OVERSOLD_MYSQL_MAX_CONNS), all of which may stay idle: a replica
// under load reuses them instead of reconnecting. Past n, a query waits for
// a connection, bounded by its context.
func (s *Store) SetMaxConns(n int) {
	s.sql.SetMaxOpenConns(n)
	s.sql.SetMaxIdleConns(n)
}
