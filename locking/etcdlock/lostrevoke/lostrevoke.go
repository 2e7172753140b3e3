// Package lostrevoke revokes the sessions an etcdlock.Locker lost, so that
// their keys go now, not at their TTL. A session is lost to the client when
// its renewals failed for a while; the server may still have it, and its
// keys with it, which hold their locks until it expires. Plugged in as
// etcdlock.Config.OnLost, a Revoker revokes each such lease in the
// background, retried until done, Close, or one TTL after the loss (no
// renewal is sent after it, so the server has surely expired it by then);
// Close revokes, within a bound, those whose revoke had not landed.
package lostrevoke

import (
	"context"
	"errors"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// CloseTimeout bounds Close's revokes: a reachable etcd answers in
// milliseconds; an unreachable one lets the leases expire by their TTL.
const CloseTimeout = 2 * time.Second

// Revoker revokes lost sessions. Close it after the Locker.
type Revoker struct {
	cli    *clientv3.Client
	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	unrevoked map[clientv3.LeaseID]struct{}
	closed    bool
}

// New returns a Revoker that revokes through cli.
func New(cli *clientv3.Client) *Revoker {
	r := &Revoker{cli: cli, unrevoked: map[clientv3.LeaseID]struct{}{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r
}

// Lost is etcdlock.Config.OnLost: it revokes lease id, granted for ttl, in
// the background.
func (r *Revoker) Lost(id clientv3.LeaseID, ttl time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unrevoked[id] = struct{}{}
	if !r.closed {
		r.wg.Go(func() { r.revokeUntil(id, time.Now().Add(ttl)) })
	}
}

func (r *Revoker) revokeUntil(id clientv3.LeaseID, expired time.Time) {
	ctx, cancel := context.WithDeadline(r.ctx, expired)
	defer cancel()
	for try := 0; ; try++ {
		err := r.revoke(ctx, id)
		if err == nil || !time.Now().Before(expired) {
			r.forget(id)
			return
		}
		d := min(25*time.Millisecond<<min(try, 6), time.Second)
		select {
		case <-time.After(d/2 + mrand.N(d/2)):
		case <-ctx.Done():
			if r.ctx.Err() == nil { // expired, not closed
				r.forget(id)
			}
			return
		}
	}
}

// revoke revokes id; nil also when the server no longer has it.
func (r *Revoker) revoke(ctx context.Context, id clientv3.LeaseID) error {
	_, err := r.cli.Revoke(ctx, id)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return err
	}
	r.forget(id)
	return nil
}

func (r *Revoker) forget(id clientv3.LeaseID) {
	r.mu.Lock()
	delete(r.unrevoked, id)
	r.mu.Unlock()
}

// Close ends the background revokes and revokes, within CloseTimeout, every
// lost session not known revoked.
func (r *Revoker) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	r.mu.Lock()
	ids := slices.Collect(maps.Keys(r.unrevoked))
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), CloseTimeout)
	defer cancel()
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			if err := r.revoke(ctx, id); err != nil {
				errs[i] = fmt.Errorf("lostrevoke: close: revoke: %w", err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
