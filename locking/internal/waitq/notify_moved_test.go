package waitq

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// A sunsubscribe is the answer to our own SUNSUBSCRIBE when that is the
// oldest command of its channel in flight, as when a channel unsubscribed
// after its linger is watched again before the server confirmed
// (SUNSUBSCRIBE, then SSUBSCRIBE, in flight): the watchers stay. Otherwise
// it is the push Redis 7 sends when the slot leaves the node (the real
// push: redislock's TestClusterWaitFollowsMigratedSlot), and the watchers
// move. Pure logic: the server cannot be made to interleave the two.
func TestSunsubscribeOursOrPushed(t *testing.T) {
	for _, tc := range []struct {
		name       string
		subscribed bool
		inflight   int
		moved      bool
	}{
		{"subscription confirmed", true, 0, true},
		{"SSUBSCRIBE in flight", true, 1, true},
		{"SUNSUBSCRIBE in flight", false, 1, false},
		{"SUNSUBSCRIBE then SSUBSCRIBE in flight", true, 2, false},
		{"SSUBSCRIBE, SUNSUBSCRIBE, SSUBSCRIBE in flight", true, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialed
			defer c.Close()
			n := NewShardNotifier(c)
			const ch = "lock:{k}:wake:x"
			w := &Watch{n: n, channel: ch, wake: make(chan struct{}, 1)}
			tp := &topic{subscribed: tc.subscribed, inflight: tc.inflight, ready: make(chan struct{})}
			if tc.subscribed { // else its watchers left: it lingered out
				tp.watches = []*Watch{w}
			}
			n.topics[ch] = tp
			n.dispatch(&redis.Subscription{Kind: "sunsubscribe", Channel: ch, Count: 0})
			if tc.moved {
				if moved, _ := w.Moved(); !moved || n.topics[ch] != nil || !isClosed(tp.ready) || len(w.wake) != 1 {
					t.Fatalf("pushed: watcher moved %v, topic kept %v, ready %v, %d wake-ups; want moved, dropped, ready and woken", moved, n.topics[ch] != nil, isClosed(tp.ready), len(w.wake))
				}
				return
			}
			if moved, _ := w.Moved(); moved || tp.inflight != tc.inflight-1 {
				t.Fatalf("ours: watcher moved %v, %d in flight; want not moved, %d", moved, tp.inflight, tc.inflight-1)
			}
		})
	}
}
