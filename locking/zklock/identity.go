package zklock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/locking"
)

// Identity names the data the tokens (zxids) count in
// (locking.Identifier): the content of the persistent node
// <Root>/.fence-id, which the first call that finds none creates with a
// random value. No key's node is named like it: escape turns every '.'
// into %2E. An ensemble restarted with its data keeps it; a new ensemble
// has none, so it gives a new identity. It keeps Root, a container node,
// from being removed.
func (l *Locker) Identity(ctx context.Context) (string, error) {
	type result struct {
		id  string
		err error
	}
	res := make(chan result, 1)
	// go-zookeeper's requests take no ctx: they run on the Locker's
	// background group, and a cancelled call returns at once.
	if !l.bg.Go(func() {
		id, err := l.identity()
		res <- result{id, err}
	}) {
		return "", errClosed
	}
	select {
	case r := <-res:
		return r.id, r.err
	case <-ctx.Done(): // a ZooKeeper that does not answer is unavailable
		return "", fmt.Errorf("zklock: identity: %w: %w", locking.ErrUnavailable, ctx.Err())
	}
}

func (l *Locker) identity() (string, error) {
	path := l.cfg.Root + "/.fence-id"
	var err error
	for range tries {
		var data []byte
		if data, _, err = l.conn.Get(path); err == nil {
			return string(data), nil
		}
		if !errors.Is(err, zk.ErrNoNode) {
			break
		}
		_, err = l.conn.Create(path, []byte(rand.Text()), 0, acl)
		if errors.Is(err, zk.ErrNoNode) { // no Root yet, or a container just removed
			err = l.makePath(l.cfg.Root)
		}
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			break
		}
	}
	if err == nil { // created, then gone each time
		err = zk.ErrNoNode
	}
	return "", fmt.Errorf("zklock: identity: %w: %w", locking.ErrUnavailable, err)
}
