// Package inventory is the stock model and its Redis cache: steps 3 and 7
// of the flow read and write it.
//
// The cache holds a SKU's stock and version together, in one hash, and is
// written by one Lua script that by default only replaces an older version:
// the version guard can then catch a read of a stale entry (its version is
// behind MySQL's), and a late writer cannot put an older stock back. The
// cache sits outside what a guard protects; MySQL stays the truth, and the
// cache must never outlive it:
//
//   - its keys carry the identity of the database they cache (New), so a
//     recreated database or another deployment's never meets its entries;
//   - every entry expires (EntryTTL) unless written again;
//   - a writer that knows MySQL's latest version (Settle) deletes an entry
//     claiming a newer one, and an admin's reset (Force) overwrites it;
//   - a writer whose guard trusts the cached read deletes the entry before
//     it writes (Invalidate), so a writer that dies or stalls between its
//     commit and its cache update leaves a miss, not a stale entry.
//
// When Redis fails, a breaker answers ErrDown at once for a short while, so
// a dead Redis costs the flow (which then reads MySQL) no waiting.
package inventory

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// EntryTTL bounds how long an entry that nobody writes again is
	// trusted: a restored database (same identity, older versions) or a
	// write lost in a Redis outage is forgotten after it.
	EntryTTL = 30 * time.Second
	// opTimeout bounds one Redis call: the cache is read inside the
	// SKU's critical section, where waiting on a dead Redis would hold
	// the lock.
	opTimeout = 250 * time.Millisecond
	// breakerCooldown is how long the cache answers ErrDown without
	// trying Redis after a failure.
	breakerCooldown = time.Second
)

// ErrDown is the error of every call while Redis cannot be used: the call
// failed, or a recent one did and the breaker is open.
var ErrDown = errors.New("inventory: stock cache unavailable")

// Item is a SKU's stock at one version. It is also the JSON of the
// inventory routes: {"sku","stock","version"}.
type Item struct {
	SKU     string `json:"sku"`
	Stock   int64  `json:"stock"`
	Version uint64 `json:"version"`
}

//go:embed set.lua
var setLua string

var setScript = redis.NewScript(setLua)

// The modes of set.lua.
const (
	modeNewer  = "newer"
	modeSettle = "settle"
	modeForce  = "force"
)

// Cache is the stock cache on Redis. It is safe for concurrent use.
type Cache struct {
	rdb       redis.UniversalClient
	prefix    string
	openUntil atomic.Int64 // unix nanoseconds: the breaker is open before then
}

// New returns a cache keeping its entries under prefix and the identity of
// the database it caches (one hash per SKU, at
// prefix+database+":stock:"+sku). rdb must have ContextTimeoutEnabled
// (redisconn sets it), or go-redis waits out its socket timeouts instead of
// the cache's own.
func New(rdb redis.UniversalClient, prefix, database string) *Cache {
	return &Cache{rdb: rdb, prefix: prefix + database + ":stock:"}
}

func (c *Cache) key(sku string) string { return c.prefix + sku }

// Get returns the SKU's cached item. On a miss it calls load (MySQL) and
// fills the cache with its answer; it returns the entry the cache then
// holds, which may be newer still if another writer came first. An error
// from load is returned as is; a Redis failure is ErrDown, and load is not
// called (the caller decides whether MySQL alone will do).
func (c *Cache) Get(ctx context.Context, sku string, load func(context.Context) (Item, error)) (Item, error) {
	var vals []any
	err := c.do(ctx, func(ctx context.Context) (err error) {
		vals, err = c.rdb.HMGet(ctx, c.key(sku), "stock", "version").Result()
		return err
	})
	if err != nil {
		return Item{}, fmt.Errorf("cache get %q: %w", sku, err)
	}
	if vals[0] != nil && vals[1] != nil {
		return parse(sku, vals)
	}
	item, err := load(ctx)
	if err != nil {
		return Item{}, err
	}
	if kept, ok, err := c.set(ctx, item, modeNewer); err == nil && ok {
		return kept, nil
	}
	return item, nil // MySQL's answer stands, cached or not
}

// Set caches item unless the cache already holds its version or a newer one.
// Version 0 is no version (MySQL's versions start at 1; a writer that could
// not learn its new version says 0): such an item is not cached.
func (c *Cache) Set(ctx context.Context, item Item) error {
	_, _, err := c.set(ctx, item, modeNewer)
	return err
}

// Settle caches item, which the caller knows to be MySQL's latest (it
// holds the SKU's lease and just committed, or just read the row): an entry
// with a newer version than item's is deleted rather than kept.
func (c *Cache) Settle(ctx context.Context, item Item) error {
	_, _, err := c.set(ctx, item, modeSettle)
	return err
}

// Force caches item whatever the cache holds: an admin's reset, made under
// the SKU's lease.
func (c *Cache) Force(ctx context.Context, item Item) error {
	_, _, err := c.set(ctx, item, modeForce)
	return err
}

// Invalidate deletes the SKU's entry: the next read goes to MySQL.
func (c *Cache) Invalidate(ctx context.Context, sku string) error {
	err := c.do(ctx, func(ctx context.Context) error { return c.rdb.Del(ctx, c.key(sku)).Err() })
	if err != nil {
		return fmt.Errorf("cache invalidate %q: %w", sku, err)
	}
	return nil
}

// set runs set.lua and returns the entry kept, if any.
func (c *Cache) set(ctx context.Context, item Item, mode string) (Item, bool, error) {
	if item.Version == 0 {
		return Item{}, false, nil
	}
	var res []any
	err := c.do(ctx, func(ctx context.Context) (err error) {
		res, err = setScript.Run(ctx, c.rdb, []string{c.key(item.SKU)},
			item.Stock, item.Version, EntryTTL.Milliseconds(), mode).Slice()
		if errors.Is(err, redis.Nil) { // settled by deleting
			res, err = nil, nil
		}
		return err
	})
	if err != nil || res == nil {
		if err != nil {
			err = fmt.Errorf("cache %s %q: %w", mode, item.SKU, err)
		}
		return Item{}, false, err
	}
	kept, err := parse(item.SKU, res)
	return kept, err == nil, err
}

// Ping checks that Redis answers, breaker or not: /readyz asks it.
func (c *Cache) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := c.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrDown, err)
	}
	return nil
}

// do runs one Redis call within opTimeout, unless the breaker is open. A
// failure opens the breaker, except when the caller's own ctx ended (a
// client that left says nothing about Redis).
func (c *Cache) do(ctx context.Context, call func(context.Context) error) error {
	if time.Now().UnixNano() < c.openUntil.Load() {
		return ErrDown
	}
	cctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	err := call(cctx)
	if err == nil || errors.Is(err, redis.Nil) {
		return err
	}
	if ctx.Err() != nil {
		return err
	}
	c.openUntil.Store(time.Now().Add(breakerCooldown).UnixNano())
	return fmt.Errorf("%w: %w", ErrDown, err)
}

// parse reads a [stock, version] pair of Redis strings.
func parse(sku string, vals []any) (Item, error) {
	if len(vals) != 2 {
		return Item{}, fmt.Errorf("cache entry %q: got %d fields, want 2", sku, len(vals))
	}
	s, _ := vals[0].(string)
	v, _ := vals[1].(string)
	stock, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return Item{}, fmt.Errorf("cache entry %q: stock: %w", sku, err)
	}
	version, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return Item{}, fmt.Errorf("cache entry %q: version: %w", sku, err)
	}
	return Item{SKU: sku, Stock: stock, Version: version}, nil
}
