package namedqueue

// BeforeGrab has q call f as each grab of an Acquire is about to begin,
// before the Locker looks at the caller's ctx; first: the first grab on a
// queue connection. Set it before the Locker's first Acquire.
func BeforeGrab(q *Queue, f func(first bool)) { q.beforeGrab = f }
