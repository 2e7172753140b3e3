package inventory

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The order queue (docs/design.md "Accepting an order (OVERSOLD_ACCEPT)"):
// with accept queue, one Lua script takes an order's quantity from the
// gate's counter and appends the order to a Redis Stream, and the order is
// answered pending; every replica reads the stream in one consumer group,
// writes the orders to MySQL and settles them here. The queue's keys share
// the gate's hash tag, so one script can touch the counters and the stream
// on a Redis Cluster too.
//
// An accepted order is counted in its counter's held until it is settled:
// the reconciler leaves the counter alone meanwhile, and a reset (PUT)
// leaves it out of the new stock, as any take in flight. Its take has no
// deadline for the back-check: the stream's pending entries are its
// record, and a consumer that dies leaves them to be claimed by another.
//
// Besides the stream: a hash of the orders not yet settled (id -> entry),
// for GET and replays while the order is pending, and a marker per
// Idempotency-Key (key -> id), which outlives its order's settle by a
// bound so that a replay racing the settle still finds the order.

//go:embed queue_accept.lua
var queueAcceptLua string

//go:embed queue_settle.lua
var queueSettleLua string

var (
	queueAccept = redis.NewScript(gateIDLua + queueAcceptLua)
	queueSettle = redis.NewScript(queueSettleLua)
)

// QueueGroup is the consumer group every replica reads the stream in.
const QueueGroup = "writers"

// Queued is an accepted order, as the stream and the queued hash hold it.
type Queued struct {
	ID         string `json:"id"`
	SKU        string `json:"sku"`
	Quantity   int64  `json:"quantity"`
	Key        string `json:"key,omitempty"` // Idempotency-Key, "" for none
	Instance   string `json:"instance"`      // the replica that accepted it
	AcceptedAt int64  `json:"accepted_at"`   // unix µs
}

// Delivery is a stream entry given to a consumer: its order, or Err when
// the entry cannot be read (it is then dropped: Drop).
type Delivery struct {
	Entry string // the stream entry's id
	Order Queued
	Epoch string // its counter's epoch at the accept ("" from an older version)
	Err   error
}

// Settled is a delivered order whose outcome MySQL holds.
type Settled struct {
	Delivery
	Confirmed bool // false: rejected, its quantity goes back to the gate
}

// Queue is the order queue on the gate's Redis. It is safe for
// concurrent use.
type Queue struct {
	g *Gate
}

// Queue returns the order queue kept beside the gate's counters.
func (g *Gate) Queue() *Queue { return &Queue{g: g} }

func (q *Queue) stream() string           { return q.g.prefix + "queue" }
func (q *Queue) queued() string           { return q.g.prefix + "queued" }
func (q *Queue) retaken() string          { return q.g.prefix + "retaken" }
func (q *Queue) marker(key string) string { return q.g.prefix + "qkey:" + key }
func (q *Queue) markerOf(o Queued) string {
	if o.Key == "" {
		return q.queued()
	}
	return q.marker(o.Key)
}

// Accept takes the order's quantity from its SKU's counter and appends it
// to the stream, in one step, adding its key to the gate's key set. When
// the order's key names an order already (queued, or settled within the
// marker's bound), it takes nothing and returns that order's id. It fails
// with ErrKnown, ErrCheck (checked false), ErrUnseeded or ErrShort as
// Gate.Take does, appending nothing.
func (q *Queue) Accept(ctx context.Context, o Queued, checked bool) (existing string, err error) {
	entry, err := json.Marshal(o)
	if err != nil {
		return "", err
	}
	keys := []string{q.stream(), q.queued(), q.markerOf(o), q.g.keySet(), q.g.keysComplete(), q.g.counter(o.SKU)}
	c := "0"
	if checked {
		c = "1"
	}
	res, err := queueAccept.Run(ctx, q.g.rdb, keys, o.ID, entry, o.Key, c, o.Quantity).Slice()
	if err != nil {
		return "", fmt.Errorf("queue accept: %w", err)
	}
	code, _ := res[0].(int64)
	switch code {
	case 0:
		return "", nil
	case 1:
		id, _ := res[1].(string)
		return id, nil
	case 2:
		return "", fmt.Errorf("%q: %w", o.SKU, ErrUnseeded)
	case 3:
		return "", fmt.Errorf("%q: %w", o.SKU, ErrShort)
	case 4:
		return "", ErrKnown
	default:
		return "", fmt.Errorf("%q: %w", o.SKU, ErrCheck)
	}
}

// Lookup returns the order id while it is queued (accepted, not settled).
func (q *Queue) Lookup(ctx context.Context, id string) (Queued, bool, error) {
	entry, err := q.g.rdb.HGet(ctx, q.queued(), id).Result()
	if errors.Is(err, redis.Nil) {
		return Queued{}, false, nil
	}
	if err != nil {
		return Queued{}, false, err
	}
	var o Queued
	if err := json.Unmarshal([]byte(entry), &o); err != nil {
		return Queued{}, false, fmt.Errorf("queued order %q: %w", id, err)
	}
	return o, true, nil
}

// Group creates the consumer group, reading from the stream's start, and
// the stream if there is none; a group that exists is left as it is.
func (q *Queue) Group(ctx context.Context) error {
	err := q.g.rdb.XGroupCreateMkStream(ctx, q.stream(), QueueGroup, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("queue group: %w", err)
	}
	return nil
}

// Read gives consumer up to count entries no consumer was given yet,
// waiting up to block for the first. They stay pending (to consumer)
// until settled.
func (q *Queue) Read(ctx context.Context, consumer string, count int, block time.Duration) ([]Delivery, error) {
	streams, err := q.g.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: QueueGroup, Consumer: consumer, Streams: []string{q.stream(), ">"},
		Count: int64(count), Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, q.regroup(ctx, "queue read", err)
	}
	var ds []Delivery
	for _, s := range streams {
		ds = append(ds, deliveries(s.Messages)...)
	}
	return ds, nil
}

// Claim gives consumer up to count entries pending to any consumer for at
// least idle: a consumer that died, or one that could not settle them.
func (q *Queue) Claim(ctx context.Context, consumer string, idle time.Duration, count int) ([]Delivery, error) {
	msgs, _, err := q.g.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: q.stream(), Group: QueueGroup, Consumer: consumer,
		MinIdle: idle, Start: "0-0", Count: int64(count),
	}).Result()
	if err != nil {
		return nil, q.regroup(ctx, "queue claim", err)
	}
	return deliveries(msgs), nil
}

// regroup answers a read's or a claim's error: a stream or group gone
// missing (a Redis restarted without persistence, whose orders are lost
// with it) is made again, and the next read finds what was accepted since;
// any other error is returned.
func (q *Queue) regroup(ctx context.Context, op string, err error) error {
	if !strings.HasPrefix(err.Error(), "NOGROUP") {
		return fmt.Errorf("%s: %w", op, err)
	}
	return q.Group(ctx)
}

func deliveries(msgs []redis.XMessage) []Delivery {
	ds := make([]Delivery, len(msgs))
	for i, m := range msgs {
		ds[i].Entry = m.ID
		ds[i].Epoch, _ = m.Values["e"].(string)
		entry, ok := m.Values["o"].(string)
		if !ok {
			ds[i].Err = fmt.Errorf("queue entry %s has no order", m.ID)
			continue
		}
		if err := json.Unmarshal([]byte(entry), &ds[i].Order); err != nil {
			ds[i].Err = fmt.Errorf("queue entry %s: %w", m.ID, err)
		}
	}
	return ds
}

// Settle settles orders of sku whose outcome MySQL holds: a confirmed
// order's take is spent, a rejected one's quantity goes back to the
// counter, once per order however often it is settled; a confirmed order
// taken from a counter since lost with its Redis's data is taken again
// from the counter seeded since, as the gate's Done does; each entry is
// acknowledged and deleted, the orders' keys are added to the gate's key
// set, and their markers expire keep later.
func (q *Queue) Settle(ctx context.Context, sku string, settled []Settled, keep time.Duration) error {
	keys := []string{q.stream(), q.queued(), q.g.counter(sku), q.g.keySet(), q.retaken()}
	args := []any{QueueGroup, keep.Milliseconds()}
	for _, s := range settled {
		mode := "back"
		if s.Confirmed {
			mode = "done"
		}
		if s.Order.Key != "" {
			keys = append(keys, q.marker(s.Order.Key))
		}
		args = append(args, s.Entry, s.Order.ID, mode, s.Order.Quantity, s.Order.Key, s.Epoch)
	}
	if err := queueSettle.Run(ctx, q.g.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("queue settle: %w", err)
	}
	return nil
}

// Drop acknowledges and deletes an entry that cannot be read.
func (q *Queue) Drop(ctx context.Context, entry string) error {
	_, err := q.g.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.XAck(ctx, q.stream(), QueueGroup, entry)
		p.XDel(ctx, q.stream(), entry)
		return nil
	})
	return err
}

// Len is the number of entries in the stream: the orders not settled yet.
func (q *Queue) Len(ctx context.Context) (int64, error) {
	return q.g.rdb.XLen(ctx, q.stream()).Result()
}
