package locktest

import (
	"runtime"
	"time"
)

// maxObjectsPerKey bounds how much ManyKeys lets the live heap grow, in
// objects a distinct key: half the one object a pending timer costs.
// Measured figures are in locking/README.md ("Server state").
const maxObjectsPerKey = 0.5

// heapReading is the live heap at one moment.
type heapReading struct{ objects, bytes int }

// liveHeap reads the live heap after collecting twice (objects with
// finalizers, such as closed connections, are freed by the second cycle).
// Go counts no timers, but a pending one (time.AfterFunc, or a Timer still
// referenced, not yet fired or stopped) is reachable from the runtime's
// timer heap, so it is a live object. So is a stopped one, until the
// runtime drops it from that heap (lazily): that, and connection pools
// that grow, make the noise. So it reads three times, 100 ms apart, and
// keeps the smallest reading: what a request in flight or a stopped timer
// holds for a moment is gone from one of them, what is kept per key (a
// pending timer) is in all three. One reading each side measured redlock
// anywhere from -0.41 to +0.30 objects a key under load.
func liveHeap() heapReading {
	var least heapReading
	for i := range 3 {
		if i > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		if r := (heapReading{int(m.HeapObjects), int(m.HeapAlloc)}); i == 0 || r.objects < least.objects {
			least = r
		}
	}
	return least
}

// settledGoroutines waits, up to 5 s, for the number of goroutines to stay
// the same for a quarter of a second (background requests and cleanups
// over), and returns it.
func settledGoroutines() int {
	n, same := runtime.NumGoroutine(), 0
	for deadline := time.Now().Add(5 * time.Second); same < 5 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		if next := runtime.NumGoroutine(); next == n {
			same++
		} else {
			n, same = next, 0
		}
	}
	return n
}
