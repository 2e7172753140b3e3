package lostrevoke_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/etcdlock"
	"github.com/oversold-lab/oversold/locking/etcdlock/internal/etcdlocktest"
	"github.com/oversold-lab/oversold/locking/etcdlock/lostrevoke"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// A session lost as Close runs, after a new one was granted, still has
// its keys on the server until its TTL: Close must revoke it too. The hook
// holds the report of each loss after the first until Close has begun, as
// a watcher not yet scheduled when its session was lost would be; the
// background revoke then races Close. Repeated, since that race may go
// either way.
func TestCloseRevokesSessionLostMeanwhile(t *testing.T) {
	endpoints := testbed.Etcd(t)
	cli := etcdlocktest.Client(t, endpoints)
	for round := range 8 {
		pfx := fmt.Sprintf("%s/%d", testbed.Prefix(t), round)
		var (
			mu       sync.Mutex
			renewals []etcdlock.Renewal
			losses   int
			closing  = make(chan struct{})
			rev      = lostrevoke.New(cli)
		)
		lose := func() { // the current session, as a renewal failed past its validity
			mu.Lock()
			defer mu.Unlock()
			renewals[len(renewals)-1].MarkLost()
		}
		cfg := etcdlock.Config{
			TTL:    time.Minute, // far beyond the test: only a revoke deletes the keys
			Prefix: pfx,
			Renew: func(ttl time.Duration, sent time.Time, renew etcdlock.RenewFunc) etcdlock.Renewal {
				r := etcdlock.Renew(ttl, sent, renew)
				mu.Lock()
				defer mu.Unlock()
				renewals = append(renewals, r)
				return r
			},
			OnLost: func(id clientv3.LeaseID, ttl time.Duration) {
				mu.Lock()
				losses++
				first := losses == 1
				mu.Unlock()
				if !first {
					<-closing
				}
				rev.Lost(id, ttl)
			},
		}
		l, err := etcdlock.New(t.Context(), cli, cfg)
		if err != nil {
			t.Fatal(err)
		}
		lose() // the first session: revoked in the background
		if _, err := l.Acquire(t.Context(), "old"); err != nil {
			t.Fatal(err)
		}
		lose() // the session holding "old": its loss is told as Close begins
		if _, err := l.Acquire(t.Context(), "new"); err != nil {
			t.Fatal(err)
		}
		close(closing)
		if err := l.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if err := rev.Close(); err != nil {
			t.Errorf("close the revoker: %v", err)
		}
		resp, err := cli.Get(t.Context(), pfx+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			t.Errorf("round %d: %s left on the server after Close", round, kv.Key)
		}
		if t.Failed() {
			return
		}
	}
}

// A session lost to the client, still alive on the server, is revoked at
// once: its keys go now, not at its TTL, and a rival is granted the lock.
func TestLostSessionRevoked(t *testing.T) {
	endpoints := testbed.Etcd(t)
	cli := etcdlocktest.Client(t, endpoints)
	rev := lostrevoke.New(cli)
	defer rev.Close()
	var renewal etcdlock.Renewal
	pfx := testbed.Prefix(t)
	cfg := etcdlock.Config{
		TTL:    time.Minute,
		Prefix: pfx,
		Renew: func(ttl time.Duration, sent time.Time, renew etcdlock.RenewFunc) etcdlock.Renewal {
			renewal = etcdlock.Renew(ttl, sent, renew)
			return renewal
		},
		OnLost: rev.Lost,
	}
	holder, err := etcdlock.New(t.Context(), cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	lease, err := holder.Acquire(t.Context(), "sku")
	if err != nil {
		t.Fatal(err)
	}
	rival, err := etcdlock.New(t.Context(), cli, etcdlock.Config{TTL: time.Minute, Prefix: pfx})
	if err != nil {
		t.Fatal(err)
	}
	defer rival.Close()
	renewal.MarkLost() // lost to the holder; the server has a minute to go
	<-lease.Lost()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	won, err := rival.Acquire(ctx, "sku")
	if err != nil {
		t.Fatalf("the rival, after the holder's session was lost: %v", err)
	}
	won.Release(t.Context())
}
