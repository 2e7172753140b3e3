// Package ensembleid gives a zklock Locker its locking.Identifier: the name
// of the ensemble data its tokens (zxids) count in, so that storage raises
// its fence epoch when the ensemble starts afresh (docs/design.md, "Guards").
package ensembleid

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/zklock"
)

// With returns outer (l, or a Locker built on it) with an Identity read
// through l.
func With(outer locking.Locker, l *zklock.Locker) locking.Locker {
	return identified{Locker: outer, zk: l}
}

type identified struct {
	locking.Locker
	zk *zklock.Locker
}

func (i identified) Identity(ctx context.Context) (string, error) { return Identity(ctx, i.zk) }

// Identity names the data the tokens count in: the content of the
// persistent node <Root>/.fence-id, which the first call that finds none
// creates with a random value. No key's node is named like it: zklock
// escapes every '.' in a key. An ensemble restarted with its data keeps it;
// a new ensemble has none, so it gives a new identity. It keeps Root, a
// container node, from being removed.
func Identity(ctx context.Context, l *zklock.Locker) (string, error) {
	type result struct {
		id  string
		err error
	}
	res := make(chan result, 1)
	// go-zookeeper's requests take no ctx: they run on a goroutine of the
	// Locker, and a cancelled call returns at once.
	if !l.Go(func() {
		id, err := identity(l)
		res <- result{id, err}
	}) {
		return "", fmt.Errorf("zklock: identity: locker closed: %w", locking.ErrUnavailable)
	}
	select {
	case r := <-res:
		return r.id, r.err
	case <-ctx.Done(): // a ZooKeeper that does not answer is unavailable
		return "", fmt.Errorf("zklock: identity: %w: %w", locking.ErrUnavailable, ctx.Err())
	}
}

func identity(l *zklock.Locker) (string, error) {
	path := l.Root() + "/.fence-id"
	var err error
	for range zklock.Tries {
		var data []byte
		if data, _, err = l.Conn().Get(path); err == nil {
			return string(data), nil
		}
		if !errors.Is(err, zk.ErrNoNode) {
			break
		}
		_, err = l.Conn().Create(path, []byte(rand.Text()), 0, l.ACL())
		if errors.Is(err, zk.ErrNoNode) { // no Root yet, or a container just removed
			err = l.MakePath(l.Root())
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
