// Package redisconn turns one address setting into a go-redis client, so the
// stock cache and the redis lock accept the same three forms:
//
//	host:port                                  one server
//	host1:port,host2:port,...                  a Redis Cluster
//	sentinel://mastername@host1:26379,host2:26379  a Sentinel-managed master
package redisconn

import (
	"fmt"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Options parses addr into go-redis universal options.
func Options(addr string) (*redis.UniversalOptions, error) {
	// Lock renewals and waits are bounded by contexts: without this,
	// go-redis ignores their deadlines and waits out its socket timeouts.
	o := &redis.UniversalOptions{ContextTimeoutEnabled: true}
	rest := addr
	if s, ok := strings.CutPrefix(addr, "sentinel://"); ok {
		name, hosts, found := strings.Cut(s, "@")
		if !found || name == "" {
			return nil, fmt.Errorf("redis address %q: want sentinel://mastername@host:port,...", addr)
		}
		o.MasterName, rest = name, hosts
	}
	for _, h := range strings.Split(rest, ",") {
		h = strings.TrimSpace(h)
		if _, _, err := net.SplitHostPort(h); err != nil {
			return nil, fmt.Errorf("redis address %q: %v", addr, err)
		}
		o.Addrs = append(o.Addrs, h)
	}
	if o.MasterName == "" && len(o.Addrs) > 1 {
		o.IsClusterMode = true
	}
	return o, nil
}

// Open returns a client for addr without contacting the server.
func Open(addr string) (redis.UniversalClient, error) {
	o, err := Options(addr)
	if err != nil {
		return nil, err
	}
	if o.IsClusterMode {
		c := redis.NewClusterClient(o.Cluster())
		c.AddHook(followFailover{c})
		return c, nil
	}
	return redis.NewUniversalClient(o), nil
}
