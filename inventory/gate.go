package inventory

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The stock gate (docs/design.md "The stock gate"): a counter per SKU on
// the cache's Redis, from which one Lua script takes an order's quantity
// before the flow, as flash-sale systems pre-deduct stock. Each take is
// recorded, in the same script, as pending under a tag (the order's
// Idempotency-Key or id) with a deadline, until the flow settles it: done
// (committed) or given back. A take left pending past its deadline is
// settled by a back-check against MySQL (order.Service).
//
// Every key carries the database's identity, as the cache's do, and one
// hash tag, so a Redis Cluster keeps them in one slot (the scripts touch
// several). SKUs and tags are exact byte strings in keys and fields.
//
// The gate also remembers the Idempotency-Keys it took for, in a set
// beside the counters (added by the take's own script), and whether that
// set is complete: every key MySQL holds is in it (CompleteKeys loads
// them). A short take under a key the gate does not know is then
// answered short with no MySQL query: the key cannot name anything. The
// set and its flag live and die with the counters (one Redis, one hash
// tag): a Redis that lost its data has neither, and the flag comes back
// only from MySQL. A committed take's settle adds its key too, for a take
// made before the set was lost; the flag names the Redis process it was
// loaded on and its replication history (master_replid), since one
// restarted from its persistence, or one that failed back after resyncing
// from the replica promoted meanwhile, may have lost keys and kept it.

//go:embed gate_id.lua
var gateIDLua string

//go:embed gate_take.lua
var gateTakeLua string

//go:embed gate_settle.lua
var gateSettleLua string

//go:embed gate_seed.lua
var gateSeedLua string

//go:embed gate_keys.lua
var gateKeysLua string

var (
	gateTake   = redis.NewScript(gateIDLua + gateTakeLua)
	gateSettle = redis.NewScript(gateSettleLua)
	gateSeed   = redis.NewScript(gateSeedLua)
	gateKeys   = redis.NewScript(gateIDLua + gateKeysLua)
)

// Errors of Gate.Take besides Redis's.
var (
	// ErrShort: a line asks for more than its counter admits.
	ErrShort = errors.New("inventory: gate short")
	// ErrInFlight: the tag's take is pending already.
	ErrInFlight = errors.New("inventory: gate take in flight")
	// ErrUnseeded: a line's SKU has no counter yet (Seed it from MySQL).
	ErrUnseeded = errors.New("inventory: gate counter missing")
	// ErrKnown: the gate took for the key before; look it up in MySQL,
	// then take again with TakeKey.Checked.
	ErrKnown = errors.New("inventory: gate knows the key")
	// ErrCheck: a line is short, and the key may be in MySQL (the gate's
	// key set is not complete): look it up before answering short.
	ErrCheck = errors.New("inventory: gate short, key unchecked")
	// ErrTooManyKeys: MySQL holds more keys than the gate's key set loads;
	// the set stays incomplete.
	ErrTooManyKeys = errors.New("inventory: too many idempotency keys for the gate's key set")
	// ErrKeyQueued: the key names an order in the queue (TakeKey.Hold).
	ErrKeyQueued = errors.New("inventory: key names a queued order")
)

// TakeKey is the Idempotency-Key a take is made under.
type TakeKey struct {
	Key     string // "" for none: no key checks
	Checked bool   // the caller looked the key up in MySQL: take even if known
	Hold    bool   // a hold's: refuse a key that names a queued order
}

// Line is a quantity of one SKU.
type Line struct {
	SKU      string
	Quantity int64
}

// Pending is a take not settled yet.
type Pending struct {
	Tag   string
	Entry string // the caller's record of what the take was for
}

// Counter is a SKU's gate counter.
type Counter struct {
	Stock, Held int64
	Seq         uint64
}

// Gate is the stock gate on Redis. It is safe for concurrent use.
type Gate struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewGate returns the gate keeping its keys under prefix and the identity
// of the database it gates.
func NewGate(rdb redis.UniversalClient, prefix, database string) *Gate {
	return &Gate{rdb: rdb, prefix: prefix + "{" + database + ":gate}:"}
}

func (g *Gate) counter(sku string) string { return g.prefix + "stock:" + sku }
func (g *Gate) pending() string           { return g.prefix + "pending" }
func (g *Gate) due() string               { return g.prefix + "due" }
func (g *Gate) skus() string              { return g.prefix + "skus" }
func (g *Gate) keySet() string            { return g.prefix + "keys" }
func (g *Gate) keysComplete() string      { return g.prefix + "keys:complete" }

func (g *Gate) keys(lines []Line) []string {
	keys := []string{g.pending(), g.due(), g.keySet()}
	for _, l := range lines {
		keys = append(keys, g.counter(l.SKU))
	}
	return keys
}

func quantities(lines []Line) []any {
	var q []any
	for _, l := range lines {
		q = append(q, l.Quantity)
	}
	return q
}

// Take takes every line's quantity, all or nothing, recording the take as
// pending under tag until deadline, and key.Key in the gate's key set. It
// fails, taking nothing, with ErrKnown or ErrCheck (key.Key not Checked),
// ErrKeyQueued (key.Hold), ErrInFlight (tag pending already), ErrUnseeded
// or ErrShort (with the line's SKU).
func (g *Gate) Take(ctx context.Context, tag, entry string, deadline time.Time, key TakeKey, lines []Line) error {
	queued := g.keySet()
	if key.Hold && key.Key != "" {
		queued = g.Queue().marker(key.Key)
	}
	keys := []string{g.pending(), g.due(), g.keySet(), g.keysComplete(), queued}
	for _, l := range lines {
		keys = append(keys, g.counter(l.SKU))
	}
	checked := "0"
	if key.Checked {
		checked = "1"
	}
	args := append([]any{tag, entry, deadline.UnixMilli(), key.Key, checked}, quantities(lines)...)
	res, err := gateTake.Run(ctx, g.rdb, keys, args...).Int64Slice()
	if err != nil {
		return fmt.Errorf("gate take: %w", err)
	}
	switch res[0] {
	case 0:
		return nil
	case 1:
		return ErrInFlight
	case 2:
		return fmt.Errorf("%q: %w", lines[res[1]-1].SKU, ErrUnseeded)
	case 3:
		return fmt.Errorf("%q: %w", lines[res[1]-1].SKU, ErrShort)
	case 4:
		return ErrKnown
	case 5:
		return fmt.Errorf("%q: %w", lines[res[1]-1].SKU, ErrCheck)
	default:
		return ErrKeyQueued
	}
}

// Done settles tag's take as committed. A take a back-check gave back
// already is taken again. It reports whether the take was still pending.
func (g *Gate) Done(ctx context.Context, tag string, lines []Line) (bool, error) {
	return g.settle(ctx, tag, "done", "", lines)
}

// GiveBack gives tag's take back, once: it reports whether it was still
// pending (false: settled already, nothing given). With tag "" it gives
// the lines back unconditionally (a committed hold cancelled or expired).
func (g *Gate) GiveBack(ctx context.Context, tag string, lines []Line) (bool, error) {
	return g.settle(ctx, tag, "back", "", lines)
}

// Settle is Done (committed true) or GiveBack for a back-check, which
// read p.Entry: a later take of the same tag is left alone.
func (g *Gate) Settle(ctx context.Context, p Pending, committed bool, lines []Line) (bool, error) {
	mode := "back"
	if committed {
		mode = "done"
	}
	return g.settle(ctx, p.Tag, mode, p.Entry, lines)
}

func (g *Gate) settle(ctx context.Context, tag, mode, expect string, lines []Line) (bool, error) {
	args := append([]any{tag, mode, expect, tagKey(tag)}, quantities(lines)...)
	n, err := gateSettle.Run(ctx, g.rdb, g.keys(lines), args...).Int64()
	if err != nil {
		return false, fmt.Errorf("gate %s: %w", mode, err)
	}
	return n == 1, nil
}

// tagKey is the Idempotency-Key a tag carries: a tag "<kind>:key:<key>"
// (kind without a colon) was taken under key; any other under none.
func tagKey(tag string) string {
	if _, rest, ok := strings.Cut(tag, ":"); ok {
		if key, ok := strings.CutPrefix(rest, "key:"); ok {
			return key
		}
	}
	return ""
}

// Seed sets the SKU's counter to MySQL's stock if it has none.
func (g *Gate) Seed(ctx context.Context, sku string, stock int64) error {
	_, err := g.seed(ctx, sku, stock, "seed", 0)
	return err
}

// Reset sets the SKU's counter to MySQL's stock less what is in flight:
// an admin's PUT.
func (g *Gate) Reset(ctx context.Context, sku string, stock int64) error {
	_, err := g.seed(ctx, sku, stock, "reset", 0)
	return err
}

// Reconcile sets the SKU's counter to MySQL's stock, read after the
// counter was read at seq, if nothing was in flight nor changed since. It
// reports whether it did.
func (g *Gate) Reconcile(ctx context.Context, sku string, stock int64, seq uint64) (bool, error) {
	return g.seed(ctx, sku, stock, "reconcile", seq)
}

func (g *Gate) seed(ctx context.Context, sku string, stock int64, mode string, seq uint64) (bool, error) {
	n, err := gateSeed.Run(ctx, g.rdb, []string{g.counter(sku), g.skus()}, stock, mode, sku, seq).Int64()
	if err != nil {
		return false, fmt.Errorf("gate %s %q: %w", mode, sku, err)
	}
	return n == 1, nil
}

// keysChunk bounds the keys one script call adds.
const keysChunk = 1000

// CompleteKeys makes the gate's key set complete, unless it is already:
// it adds every key load returns (all of MySQL's; ok false: too many to
// hold, the set stays incomplete) and marks the set complete. A set found
// incomplete (new, lost with its Redis's data, reset, or completed on
// another Redis process, which may have lost the latest keys) is loaded
// at once, and loaded once more by the first call bound after that load
// began, by Redis's clock: a take made before, whose key the set lost, may
// commit after the first load read MySQL (its settle adds the key, unless
// its replica died first). A Redis that lost its data meanwhile, or
// changed process, keeps none of a load. It reports whether the set is
// complete: false with no error when another load, a reset or a forget
// took over meanwhile (not a failure: the next call loads again), and
// ErrTooManyKeys when load returned too many.
func (g *Gate) CompleteKeys(ctx context.Context, bound time.Duration, load func(context.Context) (keys []string, ok bool, err error)) (bool, error) {
	ks := []string{g.keySet(), g.keysComplete()}
	token, err := gateKeys.Run(ctx, g.rdb, ks, "begin", bound.Milliseconds()).Text()
	if err != nil || token == "c" {
		return err == nil, err
	}
	keys, ok, err := load(ctx)
	if err != nil {
		return false, err
	}
	if !ok { // a complete set due to be loaded again is not complete any more
		if err := gateKeys.Run(ctx, g.rdb, ks, "drop", token).Err(); err != nil {
			return false, err
		}
		return false, ErrTooManyKeys
	}
	for done := false; !done; {
		n := min(len(keys), keysChunk)
		mode := "add"
		if done = n == len(keys); done {
			mode = "done"
		}
		args := []any{mode, token}
		for _, k := range keys[:n] {
			args = append(args, k)
		}
		keys = keys[n:]
		added, err := gateKeys.Run(ctx, g.rdb, ks, args...).Int64()
		if err != nil || added == 0 {
			return false, err
		}
	}
	return true, nil
}

// ResetKeys empties the key set and marks it incomplete: the next
// CompleteKeys loads it again from MySQL. A load under way adds nothing
// more.
func (g *Gate) ResetKeys(ctx context.Context) error {
	return gateKeys.Run(ctx, g.rdb, []string{g.keySet(), g.keysComplete()}, "reset").Err()
}

// ForgetKeys marks the key set incomplete and keeps its keys (those of
// takes in flight among them): the next CompleteKeys loads it afresh from
// MySQL, twice, as after a loss. A load under way adds nothing more.
func (g *Gate) ForgetKeys(ctx context.Context) error {
	return gateKeys.Run(ctx, g.rdb, []string{g.keySet(), g.keysComplete()}, "forget").Err()
}

// Counter reads the SKU's counter; ok is false when it has none.
func (g *Gate) Counter(ctx context.Context, sku string) (c Counter, ok bool, err error) {
	vals, err := g.rdb.HMGet(ctx, g.counter(sku), "stock", "held", "seq").Result()
	if err != nil || vals[0] == nil {
		return Counter{}, false, err
	}
	num := func(v any) int64 { s, _ := v.(string); n, _ := strconv.ParseInt(s, 10, 64); return n }
	return Counter{Stock: num(vals[0]), Held: num(vals[1]), Seq: uint64(num(vals[2]))}, true, nil
}

// Due returns at most limit takes whose deadline is before now.
func (g *Gate) Due(ctx context.Context, now time.Time, limit int) ([]Pending, error) {
	tags, err := g.rdb.ZRangeByScore(ctx, g.due(), &redis.ZRangeBy{
		Min: "-inf", Max: "(" + strconv.FormatInt(now.UnixMilli(), 10), Count: int64(limit),
	}).Result()
	if err != nil || len(tags) == 0 {
		return nil, err
	}
	entries, err := g.rdb.HMGet(ctx, g.pending(), tags...).Result()
	if err != nil {
		return nil, err
	}
	var due []Pending
	for i, tag := range tags {
		e, ok := entries[i].(string)
		if !ok { // settled since the range: drop its stray deadline
			g.rdb.ZRem(ctx, g.due(), tag)
			continue
		}
		due = append(due, Pending{Tag: tag, Entry: e})
	}
	return due, nil
}

// SKUs returns up to n SKUs that have a counter, for the reconciler.
func (g *Gate) SKUs(ctx context.Context, n int) ([]string, error) {
	return g.rdb.SRandMemberN(ctx, g.skus(), int64(n)).Result()
}
