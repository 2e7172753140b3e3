package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
)

func BenchmarkEtcd(b *testing.B) {
	endpoints := testbed.Etcd(b)
	runServer(b, "etcd", etcdVersion(b, endpoints), []impl{
		ours("etcd", backends.Config{EtcdEndpoints: endpoints},
			"watches its predecessor (create-revision order); a key name per session and concurrent acquisition, reused once deleted; renews with KeepAliveOnce, fences with the create revision"),
		etcdConcurrency(endpoints),
	})
}

// etcdConcurrency is the peer: go.etcd.io/etcd/client/v3/concurrency's Mutex.
func etcdConcurrency(endpoints []string) impl {
	return impl{
		name: "etcd-concurrency",
		wait: "concurrency.Mutex: watches its predecessor; one session (lease) per contender",
		open: func(ctx context.Context) (*contender, error) {
			cli, err := etcdClient(endpoints)
			if err != nil {
				return nil, err
			}
			// A session per contender: a Mutex keys itself by its
			// session's lease, so two contenders on one session
			// would share the lock. Not WithContext(ctx): the
			// session must outlive the opening ctx.
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttl/time.Second)))
			if err != nil {
				cli.Close()
				return nil, err
			}
			return &contender{
				lock: func(ctx context.Context, key string) (unlockFunc, error) {
					m := concurrency.NewMutex(s, "/oversold-bench/"+key)
					if err := m.Lock(ctx); err != nil {
						return nil, err
					}
					return m.Unlock, nil
				},
				close: func() error { return errors.Join(s.Close(), cli.Close()) },
			}, nil
		},
	}
}

// etcdClient has the client settings backends.Open uses for ours.
func etcdClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
}

func etcdVersion(b *testing.B, endpoints []string) string {
	b.Helper()
	cli, err := etcdClient(endpoints)
	if err != nil {
		b.Fatalf("etcd: %v", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, endpoints[0])
	if err != nil {
		b.Fatalf("etcd %s: %v", endpoints[0], err)
	}
	return "etcd " + st.Version
}
