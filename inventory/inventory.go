// Package inventory is the stock model and its Redis cache: steps 3 and 7
// of the flow read and write it.
//
// The cache holds a SKU's stock and version together, in one hash, and is
// written by one Lua script that only ever replaces an older version: the
// version guard can then catch a read of a stale entry (its version is
// behind MySQL's), and a late writer cannot put an older stock back. The
// cache sits outside what a guard protects; MySQL stays the truth.
package inventory

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Item is a SKU's stock at one version. It is also the JSON of the
// inventory routes: {"sku","stock","version"}.
type Item struct {
	SKU     string `json:"sku"`
	Stock   int64  `json:"stock"`
	Version uint64 `json:"version"`
}

//go:embed set.lua
var setLua string

var setIfNewer = redis.NewScript(setLua)

// Cache is the stock cache on Redis. It is safe for concurrent use.
type Cache struct {
	rdb    redis.UniversalClient
	prefix string
}

// New returns a cache keeping its entries under prefix (one hash per SKU,
// at prefix+"stock:"+sku). Deployments sharing a Redis need their own
// prefixes; so do tests.
func New(rdb redis.UniversalClient, prefix string) *Cache {
	return &Cache{rdb: rdb, prefix: prefix}
}

func (c *Cache) key(sku string) string { return c.prefix + "stock:" + sku }

// Get returns the SKU's cached item. On a miss it calls load (MySQL) and
// fills the cache with its answer; it returns the entry the cache then
// holds, which may be newer still if another writer came first. An error
// from load is returned as is.
func (c *Cache) Get(ctx context.Context, sku string, load func(context.Context) (Item, error)) (Item, error) {
	vals, err := c.rdb.HMGet(ctx, c.key(sku), "stock", "version").Result()
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
	return c.set(ctx, item)
}

// Set caches item unless the cache already holds its version or a newer one.
// Version 0 is no version (MySQL's versions start at 1; a writer that could
// not learn its new version says 0): such an item is not cached.
func (c *Cache) Set(ctx context.Context, item Item) error {
	if item.Version == 0 {
		return nil
	}
	_, err := c.set(ctx, item)
	return err
}

func (c *Cache) set(ctx context.Context, item Item) (Item, error) {
	res, err := setIfNewer.Run(ctx, c.rdb, []string{c.key(item.SKU)}, item.Stock, item.Version).Slice()
	if err != nil {
		return Item{}, fmt.Errorf("cache set %q: %w", item.SKU, err)
	}
	return parse(item.SKU, res)
}

// Ping checks that Redis answers.
func (c *Cache) Ping(ctx context.Context) error { return c.rdb.Ping(ctx).Err() }

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
