package redislock

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// CheckEviction refuses a Redis that may evict keys. Under any
// maxmemory-policy but noeviction, memory pressure can drop a held lock's
// key (a waiter then acquires while the holder's Lost is still open) or its
// fence counter (tokens then repeat without any restart). With noeviction,
// Redis refuses writes when full instead, and Acquire fails with
// locking.ErrUnavailable. On a Cluster every master is checked.
func CheckEviction(ctx context.Context, c redis.UniversalClient) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return checkEviction(ctx, m, m.Options().Addr)
		})
	}
	return checkEviction(ctx, c, "")
}

func checkEviction(ctx context.Context, c redis.Cmdable, addr string) error {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return fmt.Errorf("read maxmemory-policy: %w", err)
	}
	for line := range strings.Lines(info) {
		if policy, ok := strings.CutPrefix(strings.TrimSpace(line), "maxmemory_policy:"); ok {
			if policy == "noeviction" {
				return nil
			}
			if addr != "" {
				addr = " " + addr
			}
			return fmt.Errorf("redis%s has maxmemory-policy %s, which can evict keys that must not vanish: set maxmemory-policy noeviction (redis.conf, or CONFIG SET maxmemory-policy noeviction)", addr, policy)
		}
	}
	return fmt.Errorf("redis%s: INFO memory has no maxmemory_policy", addr)
}
