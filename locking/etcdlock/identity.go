package etcdlock

import (
	"context"
	"crypto/rand"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oversold-lab/oversold/locking"
)

// Identity names the data the tokens (revisions) count in
// (locking.Identifier): the value of <Prefix>/.fence-id, put with a random
// value by the first call that finds none. It goes wherever the data goes;
// the cluster ID would not do (docs/locks/etcd.md).
func (l *Locker) Identity(ctx context.Context) (string, error) {
	key, mine := l.cfg.Prefix+"/.fence-id", rand.Text()
	resp, err := l.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, mine)).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return "", fmt.Errorf("etcdlock: identity: %w: %w", locking.ErrUnavailable, err)
	}
	if resp.Succeeded {
		return mine, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 { // not possible in the transaction's snapshot
		return "", fmt.Errorf("etcdlock: identity: %s vanished", key)
	}
	return string(kvs[0].Value), nil
}
