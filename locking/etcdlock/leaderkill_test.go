package etcdlock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/etcdlock"
)

// A leader killed under Acquires and Releases in flight fails them with
// "error reading from server: EOF", "request timed out, possibly due to
// previous leader failure", ..., which the client does not retry for a
// write: the Locker does, so none of them fails. A private cluster: the
// kill must not disturb the other tests.
func TestAcquireReleaseAcrossLeaderKill(t *testing.T) {
	c, err := testbed.StartEtcdCluster(t.Context(), testbed.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Addrs(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// The TTL outlives the election and the client's move to another member.
	l, err := etcdlock.New(t.Context(), cli, etcdlock.Config{TTL: 10 * time.Second, Prefix: testbed.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	// Workers acquire and release their own key in a loop, so that writes
	// are in flight when the leader dies.
	var (
		stop, start = make(chan struct{}), make(chan struct{})
		done        [4]atomic.Int64 // each worker's rounds
		mu          sync.Mutex
		failed      []error
		wg          sync.WaitGroup
	)
	for w := range done {
		wg.Go(func() {
			<-start
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
				lease, err := l.Acquire(ctx, fmt.Sprint("sku", w))
				if err == nil {
					err = lease.Release(ctx)
				}
				cancel()
				if err != nil {
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
				}
				done[w].Add(1)
			}
		})
	}
	close(start)
	rounds := func() (n int64) {
		for w := range done {
			n += done[w].Load()
		}
		return n
	}
	for rounds() < 20 { // under way
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	old, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Nodes[old].Kill(); err != nil {
		t.Fatal(err)
	}
	killed, t0 := rounds(), time.Now()
	now, err := c.WaitLeader(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("member %d killed, member %d leads %v later", old, now, time.Since(t0).Round(time.Millisecond))
	// Every worker gets a round done after the election.
	for w := range done {
		for was := done[w].Load(); done[w].Load() < was+2; {
			time.Sleep(10 * time.Millisecond)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d rounds before the kill, %d in all", killed, rounds())
	for _, err := range failed {
		t.Errorf("across the leader kill: %v", err)
	}
}
