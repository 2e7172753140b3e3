package redlock

import "testing"

// WaitForAll makes every request of every Locker wait for every node until
// tb ends: Redlock without quorum returns, the broken variant.
func WaitForAll(tb testing.TB) {
	waitAll.Store(true)
	tb.Cleanup(func() { waitAll.Store(false) })
}
