package redislock

import (
	"context"
	"crypto/rand"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/locking"
)

// identityScript sets the identity key to ARGV[1] unless it is set, and
// returns its value: concurrent first calls all get the one that won.
var identityScript = redis.NewScript(`redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])`)

// Identity names the data the tokens count in (locking.Identifier): the
// value of the key <Prefix>fence-id, which the first call that finds none
// sets to a random one, with no expiry (New's servers evict nothing:
// CheckEviction). A Redis restarted with its data keeps it; one that lost
// its data (restarted without persistence, flushed, replaced, failed over
// to a replica that never had the key) has none, so the next call gives a
// new identity, and storage a new fence epoch above the fences its lost
// counters wrote. On a Cluster the key lives on one master: another
// master that loses its data alone keeps the identity (locking/README.md).
func (l *Locker) Identity(ctx context.Context) (string, error) {
	id, err := identityScript.Run(ctx, l.client, []string{l.cfg.Prefix + "fence-id"}, rand.Text()).Text()
	if err != nil {
		return "", fmt.Errorf("redislock: identity: %w: %w", locking.ErrUnavailable, err)
	}
	return id, nil
}
