package etcdlock

import (
	"context"
	"crypto/rand"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oversold-lab/oversold/locking"
)

// Identity names the data the tokens (revisions) count in
// (locking.Identifier): the value of the key <Prefix>/.fence-id, which the
// first call that finds none puts, in one transaction, with a random value.
// No lock key is named like it: theirs are <Prefix>/<escaped key>/...
// A cluster restarted with its data, or restored from a snapshot, keeps
// it; a new cluster has none, so it gives a new identity. The cluster ID
// would not do: it is a hash of the members' peer URLs and the
// initial-cluster-token, so a cluster rebuilt with the same settings (every
// default single-node etcd) has the old one, with revisions from 1 again.
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
