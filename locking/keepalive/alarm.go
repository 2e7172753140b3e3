package keepalive

import (
	"container/heap"
	"sync"
	"time"
)

// alarm is one of a Watchdog's two timers (its next renewal, its expiry).
// The alarms of every Watchdog in the process share one runtime timer,
// armed at the earliest alarm: starting a lease sets two alarms that are
// due later than those already set (the same TTL, granted later), which
// costs a heap push and no runtime timer. A runtime timer per lease cost
// more than its start and stop: each one due before every other timer of
// its P woke an idle thread (the runtime's wakeNetPoller) to recompute the
// poller's sleep, a quarter of the client CPU of an uncontended Acquire and
// Release (bench/, pprof).
//
// Its semantics are time.AfterFunc's: set is Reset, stop is Stop, and a
// due alarm runs its action in a goroutine of its own; an action already
// started when stop is called still runs (Watchdog checks stopped).
type alarm struct {
	k      *Watchdog
	expire bool      // MarkLost, else renewOnce
	at     time.Time // due time, monotonic
	i      int       // index in alarms.due; -1 when not set
}

func (a *alarm) run() {
	if a.expire {
		a.k.expire()
	} else {
		a.k.renewOnce()
	}
}

// alarms is the process's one schedule of alarms.
var alarms struct {
	mu    sync.Mutex
	due   alarmHeap
	timer *time.Timer // calls ring at armed; made at the first set
	armed time.Time   // when timer fires; zero when it is not pending
}

// set makes a due d from now, replacing a time set before.
func (a *alarm) set(d time.Duration) {
	now := time.Now()
	at := now.Add(d)
	alarms.mu.Lock()
	defer alarms.mu.Unlock()
	a.at = at
	if a.i >= 0 {
		heap.Fix(&alarms.due, a.i)
	} else {
		heap.Push(&alarms.due, a)
	}
	if alarms.armed.IsZero() || at.Before(alarms.armed) {
		arm(now, at)
	}
}

// stop unsets a, if set.
func (a *alarm) stop() {
	alarms.mu.Lock()
	defer alarms.mu.Unlock()
	if a.i >= 0 {
		heap.Remove(&alarms.due, a.i)
	}
}

// arm points the runtime timer at at; alarms.mu is held. An alarm unset
// since it was armed leaves it early: ring then finds nothing due and
// arms it again.
func arm(now, at time.Time) {
	alarms.armed = at
	if alarms.timer == nil {
		alarms.timer = time.AfterFunc(at.Sub(now), ring)
	} else {
		alarms.timer.Reset(at.Sub(now))
	}
}

// ring runs the alarms due, each in a goroutine of its own, and arms the
// timer for the next one.
func ring() {
	alarms.mu.Lock()
	now := time.Now()
	var due []*alarm
	for len(alarms.due) > 0 && !alarms.due[0].at.After(now) {
		due = append(due, heap.Pop(&alarms.due).(*alarm))
	}
	alarms.armed = time.Time{}
	if len(alarms.due) > 0 {
		arm(now, alarms.due[0].at)
	}
	alarms.mu.Unlock()
	for _, a := range due {
		go a.run()
	}
}

// alarmHeap orders alarms by due time (container/heap).
type alarmHeap []*alarm

func (h alarmHeap) Len() int           { return len(h) }
func (h alarmHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h alarmHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].i, h[j].i = i, j
}
func (h *alarmHeap) Push(x any) {
	a := x.(*alarm)
	a.i = len(*h)
	*h = append(*h, a)
}
func (h *alarmHeap) Pop() any {
	old := *h
	a := old[len(old)-1]
	old[len(old)-1] = nil // no hold on a released lease's Watchdog
	*h = old[:len(old)-1]
	a.i = -1
	return a
}
