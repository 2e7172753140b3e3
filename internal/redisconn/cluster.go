package redisconn

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// followFailover makes a Cluster client reload its slot map as soon as a
// command fails on a node that is gone or a cluster that is down, instead
// of at its next periodic reload (a minute by default). A client learns a
// slot's new master only from a MOVED reply or a reload, and a dead master
// answers neither: without this, every command on its slots keeps dialing
// the dead node for up to a minute after the replica took over. Reloads
// are rate-limited by go-redis (one at a time, 200 ms apart).
type followFailover struct{ c *redis.ClusterClient }

func (h followFailover) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h followFailover) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if nodeFailed(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h followFailover) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if nodeFailed(err) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

// nodeFailed: the error says a node did not answer (refused, reset, timed
// out) or the cluster is down, not that a command was wrong.
func nodeFailed(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "CLUSTERDOWN") || strings.HasPrefix(msg, "TRYAGAIN") || strings.Contains(msg, "connection refused")
}
