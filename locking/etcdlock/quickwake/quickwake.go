// Package quickwake wakes an etcdlock waiter as soon as its predecessor's
// key goes, over a watch stream kept open.
//
// etcd serves a watch that starts in the past (etcdlock.WatchDelete's, from
// the revision after the waiter's snapshot, once anything else was written
// meanwhile) from a loop that runs every 100 ms: mvcc's unsynced watchers.
// On a busy cluster that delays every handoff. Waiter's watch starts at the
// current revision instead; once it is in place, a read checks that the key
// is still there: a deletion before that read is seen by the read, one
// after it by the watch.
//
// The client closes a watch stream with its last watch, so without an idle
// watch every waiter's and every holder's watch would open a new gRPC
// stream: KeepStream keeps one open until stopped.
package quickwake

import (
	"context"
	"errors"
	mrand "math/rand/v2"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oversold-lab/oversold/locking/etcdlock"
)

var _ etcdlock.Waiter = Waiter{}

// Waiter is an etcdlock.Waiter whose watch starts now, not in the past.
type Waiter struct{}

// WaitDelete waits until pred, as created at its create revision, is
// deleted; nil means "look again". The check compares the create revision:
// a name is used again once deleted (namereuse), and a later key of that
// name is behind ours in the queue: waiting for it would wait for ourselves.
func (Waiter) WaitDelete(ctx context.Context, cli *clientv3.Client, pred *mvccpb.KeyValue, _ int64) error {
	key := string(pred.Key)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range cli.Watch(ctx, key, clientv3.WithCreatedNotify(), clientv3.WithFilterPut()) {
		switch {
		case wr.CompactRevision != 0 || etcdlock.Deleted(wr):
			return nil
		case wr.Err() != nil:
			return wr.Err()
		case wr.Created:
			resp, err := cli.Get(ctx, key, clientv3.WithKeysOnly())
			if err != nil {
				return err
			}
			if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != pred.CreateRevision {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("quickwake: watch closed")
}

// KeepStream keeps one idle watch open on key (one no lock writes: the
// Locker's prefix itself), with the metadata of etcdlock's watches, so
// that theirs cost one request on a stream already open. stop ends it and
// waits for it.
func KeepStream(cli *clientv3.Client, key string) (stop func() error) {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	var wg sync.WaitGroup
	wg.Go(func() {
		for try := 0; ctx.Err() == nil; try++ {
			for range cli.Watch(ctx, key) {
			}
			d := min(25*time.Millisecond<<min(try, 6), time.Second)
			select {
			case <-time.After(d/2 + mrand.N(d/2)):
			case <-ctx.Done():
			}
		}
	})
	return func() error {
		cancel()
		wg.Wait()
		return nil
	}
}
