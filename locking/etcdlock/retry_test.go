package etcdlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/etcdlock"
)

// A leader change answers a write with "leader changed" or "no leader",
// which the client does not retry (a write may have landed): Acquire's
// create and Release's delete try again, so neither fails for an election.
// Here the first create transaction or delete is answered so, after it
// reached etcd (it landed, the reply was lost) or instead of sending it.
func TestWriteRetriedAcrossLeaderChange(t *testing.T) {
	endpoints := testbed.Etcd(t)
	for _, c := range []struct {
		name   string
		method string // the request that fails once
		landed bool
		err    error
	}{
		{"create landed", "/etcdserverpb.KV/Txn", true, rpctypes.ErrGRPCLeaderChanged},
		{"create not sent", "/etcdserverpb.KV/Txn", false, rpctypes.ErrGRPCNoLeader},
		{"delete landed", "/etcdserverpb.KV/DeleteRange", true, rpctypes.ErrGRPCLeaderChanged},
		{"delete not sent", "/etcdserverpb.KV/DeleteRange", false, rpctypes.ErrGRPCNoLeader},
	} {
		t.Run(c.name, func(t *testing.T) {
			var armed atomic.Bool
			var other func(context.Context) error // a write of someone else's
			fail := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if method != c.method || !armed.CompareAndSwap(true, false) {
					return invoke(ctx, method, req, reply, cc, opts...)
				}
				if c.landed {
					if err := invoke(ctx, method, req, reply, cc, opts...); err != nil {
						t.Errorf("the write to fail after it landed: %v", err)
					}
					// The revision moves on before the retry: its own is no
					// longer our key's create revision.
					if err := other(ctx); err != nil {
						t.Error(err)
					}
				}
				return c.err
			}
			cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
				DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(fail)}})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			pfx := testbed.Prefix(t)
			other = func(ctx context.Context) error { _, err := cli.Put(ctx, pfx+"/other", ""); return err }
			l, err := etcdlock.New(t.Context(), cli, etcdlock.Config{TTL: 30 * time.Second, Prefix: pfx})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()

			armed.Store(c.method == "/etcdserverpb.KV/Txn")
			lease, err := l.Acquire(ctx, "sku")
			if err != nil {
				t.Fatalf("acquire: %v", err)
			}
			// One key, ours, whose create revision is the token.
			resp, err := cli.Get(ctx, pfx+"/sku/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) != 1 || uint64(resp.Kvs[0].CreateRevision) != lease.Token() {
				t.Fatalf("queue after acquire: %d keys (%v), token %d; want our key alone", len(resp.Kvs), resp.Kvs, lease.Token())
			}
			if armed.Load() {
				t.Fatal("acquire sent no create transaction")
			}

			armed.Store(c.method == "/etcdserverpb.KV/DeleteRange")
			if err := lease.Release(ctx); err != nil {
				t.Fatalf("release: %v", err)
			}
			if armed.Load() {
				t.Fatal("release sent no delete")
			}
			if resp, err = cli.Get(ctx, pfx+"/sku/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
				t.Fatalf("queue after release: %v keys, %v; want none", resp, err)
			}
		})
	}
}
