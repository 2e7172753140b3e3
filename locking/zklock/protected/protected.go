// Package protected is the zklock recipe's protected create (Curator's
// protection mode: a fresh GUID in the node's name, looked for after a
// create whose reply was lost) made to ride out a disconnect: where
// zklock.CreateOnce answers unavailable, Create keeps trying, the create or
// the look for its node, for as long as the session may live. It takes the
// node only for the session the connection had both before the create (or
// the look that found it) and after it. docs/locks/zklock.md tells why.
package protected

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oversold-lab/oversold/locking/zklock"
)

// Prefix is Curator's marker for a protected node.
const Prefix = "_c_"

// Creator is a zklock.CreateFunc (its Create method) that finds the node of
// a create whose reply was lost.
type Creator struct {
	// AfterCreate, if set, runs where Create has its node and is about to
	// check that its session is still the connection's (tests).
	AfterCreate func(path string)
}

// Create is Creator{}.Create: plug it as zklock.Config.Create.
func Create(l *zklock.Locker, parent string) (string, int64, error) {
	return Creator{}.Create(l, parent)
}

// Create makes our node, protected by a fresh GUID, and returns its path and
// the session that owns it. On failure it removes in the background the
// node the create may have left.
func (c Creator) Create(l *zklock.Locker, parent string) (string, int64, error) {
	guid := newGUID()
	path, session, err := c.create(l, parent, guid)
	if err != nil {
		l.Go(func() { removeGUID(l, parent, guid) })
	}
	return path, session, err
}

// create tries until the node is made or found. If the session changed
// before the answer was read, the node may have died with the old one
// while a follower still lists it, and a lease recorded under the new
// session would pass its session check: ErrVanished, queue again.
func (c Creator) create(l *zklock.Locker, parent, guid string) (string, int64, error) {
	conn := l.Conn()
	prefix := parent + "/" + Prefix + guid + "-" + zklock.Suffix
	owned := func(path string, session int64) (string, int64, error) {
		if c.AfterCreate != nil {
			c.AfterCreate(path)
		}
		if session == 0 || conn.SessionID() != session {
			return "", 0, zklock.ErrVanished
		}
		return path, session, nil
	}
	search := false // a create's outcome is unknown: look before creating again
	var err error
	// A lost connection is retried for as long as the wait retries its
	// looks: the session either comes back within its timeout or expires.
	var failing time.Time
	for try := 0; try < zklock.Tries || time.Since(failing) <= l.SessionTimeout(); try++ {
		session := conn.SessionID()
		var path string
		if search {
			if path, err = find(conn, parent, guid); err == nil && path != "" {
				return owned(path, session)
			}
			search = err != nil
		}
		if !search {
			session = conn.SessionID()
			path, err = conn.Create(prefix, nil, zk.FlagEphemeral|zk.FlagSequence, l.ACL())
			switch {
			case err == nil:
				return owned(path, session)
			case errors.Is(err, zk.ErrNoNode):
				// No parent yet, or a container the server just removed.
				err = l.MakePath(parent)
			case errors.Is(err, zk.ErrSessionExpired):
				// A node of the expired session is gone with it: create
				// again once the connection has its new session.
			case ambiguous(err):
				search = true
			}
		}
		switch {
		case err == nil:
			continue
		case !ambiguous(err) && !errors.Is(err, zk.ErrSessionExpired):
			return "", 0, err
		}
		if failing.IsZero() {
			failing = time.Now()
		}
		if !l.Sleep(context.Background(), zklock.Backoff(try)) {
			return "", 0, err
		}
	}
	if err == nil { // the parent kept vanishing
		err = zk.ErrNoNode
	}
	return "", 0, err
}

// find returns the path of our node (by guid) under parent, or "", syncing
// first: the server we reconnected to may lag the one that took the create.
func find(conn *zk.Conn, parent, guid string) (string, error) {
	_, err := conn.Sync(parent)
	var children []string
	if err == nil {
		children, _, err = conn.Children(parent)
	}
	if errors.Is(err, zk.ErrNoNode) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	for _, c := range children {
		if strings.HasPrefix(c, Prefix+guid) {
			return parent + "/" + c, nil
		}
	}
	return "", nil
}

// removeGUID deletes our node after a create whose outcome is unknown,
// looking for it until a look answers or the Locker closes.
func removeGUID(l *zklock.Locker, parent, guid string) {
	for n := 0; ; n++ {
		session := l.Conn().SessionID()
		path, err := find(l.Conn(), parent, guid)
		if err == nil {
			if path != "" {
				l.Remove(path, session)
			}
			return
		}
		if !l.Sleep(context.Background(), zklock.Backoff(n)) {
			return
		}
	}
}

// ambiguous reports whether a request may have been applied although it
// failed: the connection broke before its reply came.
func ambiguous(err error) bool {
	for _, definite := range []error{
		zk.ErrNoNode, zk.ErrNodeExists, zk.ErrNoAuth, zk.ErrBadVersion, zk.ErrInvalidACL,
		zk.ErrNoChildrenForEphemerals, zk.ErrNotEmpty, zk.ErrBadArguments, zk.ErrInvalidPath,
		zk.ErrInvalidFlags, zk.ErrAPIError, zk.ErrSessionExpired,
	} {
		if errors.Is(err, definite) {
			return false
		}
	}
	return true
}

func newGUID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
