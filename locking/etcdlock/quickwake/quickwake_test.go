package quickwake_test

import (
	"context"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/etcdlock"
	"github.com/oversold-lab/oversold/locking/etcdlock/internal/etcdlocktest"
	"github.com/oversold-lab/oversold/locking/etcdlock/quickwake"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// A predecessor deleted after the waiter read it but before its watch is in
// place, or deleted and made again under its name (a reused name, now
// behind ours), is no predecessor to wait for: WaitDelete says "look
// again" at once. A watch that starts now would otherwise wait for an
// event that already happened. The recipe's waiter, whose watch starts in
// the past, passes the same checks.
func TestWaitDeleteSeesWhatCameBeforeTheWatch(t *testing.T) {
	cli := etcdlocktest.Client(t, testbed.Etcd(t))
	for name, w := range map[string]etcdlock.Waiter{"quickwake": quickwake.Waiter{}, "recipe": etcdlock.WatchDelete{}} {
		for _, again := range []bool{false, true} {
			key := testbed.Prefix(t) + "/pred"
			if _, err := cli.Put(t.Context(), key, ""); err != nil {
				t.Fatal(err)
			}
			read, err := cli.Get(t.Context(), key) // the waiter's look at the queue
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Delete(t.Context(), key); err != nil {
				t.Fatal(err)
			}
			if again {
				if _, err := cli.Put(t.Context(), key, ""); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			if err := w.WaitDelete(ctx, cli, read.Kvs[0], read.Header.Revision); err != nil {
				t.Errorf("%s, made again %v: WaitDelete = %v, want nil (look again) at once", name, again, err)
			}
			cancel()
		}
	}
}
