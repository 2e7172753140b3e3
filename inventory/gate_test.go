package inventory_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/inventory"
)

func newGate(t *testing.T) *inventory.Gate {
	t.Helper()
	g, _, _ := gateOn(t)
	return g
}

// loseData deletes every key under prefix, as a Redis restarted without
// persistence has lost them.
func loseData(t *testing.T, rdb *redis.Client, prefix string) {
	t.Helper()
	keys, err := rdb.Keys(t.Context(), prefix+"*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("gate keys: %v %v", keys, err)
	}
	if err := rdb.Del(t.Context(), keys...).Err(); err != nil {
		t.Fatal(err)
	}
}

// keyedGate seeds SKU "S" on g with stock units and marks its key set
// complete (MySQL holding no key); it returns a take of one unit under a
// key.
func keyedGate(t *testing.T, g *inventory.Gate, stock int64) (take func(key string) error) {
	t.Helper()
	ctx := t.Context()
	if err := g.Seed(ctx, "S", stock); err != nil {
		t.Fatal(err)
	}
	if ok, err := g.CompleteKeys(ctx, time.Hour, func(context.Context) ([]string, bool, error) { return nil, true, nil }); err != nil || !ok {
		t.Fatalf("complete keys: %v %v", ok, err)
	}
	lines := []inventory.Line{{SKU: "S", Quantity: 1}}
	return func(key string) error {
		return g.Take(ctx, "order:key:"+key, "e", time.Now().Add(time.Hour), inventory.TakeKey{Key: key}, lines)
	}
}

// gateOn is newGate with its client and key prefix, for tests that reach
// under the gate (its data lost, another Redis process).
func gateOn(t *testing.T) (*inventory.Gate, *redis.Client, string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testbed.Redis(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	prefix := testbed.Prefix(t) + ":"
	return inventory.NewGate(rdb, prefix, "db"), rdb, prefix
}

func counter(t *testing.T, g *inventory.Gate, sku string) inventory.Counter {
	t.Helper()
	c, ok, err := g.Counter(t.Context(), sku)
	if err != nil || !ok {
		t.Fatalf("counter %q: %v %v", sku, ok, err)
	}
	return c
}

// A take is settled once, whoever settles it; a done after a back-check
// gave the take back takes it again (the order did commit); a back-check
// that read an earlier take of a tag leaves a later one alone; SKUs are
// exact bytes.
func TestGateSettlesOnce(t *testing.T) {
	g := newGate(t)
	ctx := t.Context()
	lines := []inventory.Line{{SKU: "SKU-1", Quantity: 2}}
	if err := g.Take(ctx, "t", "e1", time.Now(), inventory.TakeKey{}, lines); !errors.Is(err, inventory.ErrUnseeded) {
		t.Fatalf("take on no counter: %v, want ErrUnseeded", err)
	}
	for _, sku := range []string{"SKU-1", "sku-1"} {
		if err := g.Seed(ctx, sku, 5); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Seed(ctx, "SKU-1", 99); err != nil { // NX: kept at 5
		t.Fatal(err)
	}
	if err := g.Take(ctx, "t", "e1", time.Now(), inventory.TakeKey{}, lines); err != nil {
		t.Fatal(err)
	}
	if err := g.Take(ctx, "t", "e1", time.Now(), inventory.TakeKey{}, lines); !errors.Is(err, inventory.ErrInFlight) {
		t.Fatalf("second take of a tag in flight: %v", err)
	}
	if c := counter(t, g, "sku-1"); c.Stock != 5 {
		t.Fatalf("sku-1 moved with SKU-1: %+v", c)
	}
	// The back-check gives it back; the flow's own give-back then gives nothing.
	if back, err := g.Settle(ctx, inventory.Pending{Tag: "t", Entry: "e1"}, false, lines); err != nil || !back {
		t.Fatalf("back-check: %v %v", back, err)
	}
	if back, err := g.GiveBack(ctx, "t", lines); err != nil || back {
		t.Fatalf("second give-back: %v %v, want nothing given", back, err)
	}
	if c := counter(t, g, "SKU-1"); c.Stock != 5 || c.Held != 0 {
		t.Fatalf("after the give-backs: %+v, want 5, 0", c)
	}
	// Its order committed after all: done takes it again.
	if pending, err := g.Done(ctx, "t", lines); err != nil || pending {
		t.Fatalf("late done: %v %v", pending, err)
	}
	if c := counter(t, g, "SKU-1"); c.Stock != 3 || c.Held != 0 {
		t.Fatalf("after the late done: %+v, want 3, 0", c)
	}
	// A later take of the same tag is not the one a back-check read.
	if err := g.Take(ctx, "t", "e2", time.Now(), inventory.TakeKey{}, lines); err != nil {
		t.Fatal(err)
	}
	if back, err := g.Settle(ctx, inventory.Pending{Tag: "t", Entry: "e1"}, false, lines); err != nil || back {
		t.Fatalf("stale back-check settled a later take: %v %v", back, err)
	}
	if err := g.Take(ctx, "u", "e", time.Now(), inventory.TakeKey{}, []inventory.Line{{SKU: "SKU-1", Quantity: 2}}); !errors.Is(err, inventory.ErrShort) {
		t.Fatalf("take of 2 from 1: %v, want ErrShort", err)
	}
	if c := counter(t, g, "SKU-1"); c.Stock != 1 || c.Held != 2 {
		t.Fatalf("end: %+v, want 1, 2", c)
	}
}

// The take script's answers under a key: taken (the key remembered),
// known (the gate took for it before), check (short, and the key set not
// known complete), short (the set complete, or the key checked in MySQL);
// a hold's key naming a queued order is refused. The set is complete only
// once loaded, and not any more once its Redis lost its data.
func TestGateKeys(t *testing.T) {
	g, rdb, prefix := gateOn(t)
	ctx := t.Context()
	lines := []inventory.Line{{SKU: "S", Quantity: 1}}
	take := func(tag string, key inventory.TakeKey) error {
		return g.Take(ctx, tag, "e", time.Now().Add(time.Hour), key, lines)
	}
	if err := g.Seed(ctx, "S", 1); err != nil {
		t.Fatal(err)
	}
	if err := take("order:key:a", inventory.TakeKey{Key: "a"}); err != nil {
		t.Fatalf("take under a: %v", err)
	}
	for _, tc := range []struct {
		name string
		key  inventory.TakeKey
		want error
	}{
		{"known, in stock or not", inventory.TakeKey{Key: "a"}, inventory.ErrKnown},
		{"known, checked: in flight", inventory.TakeKey{Key: "a", Checked: true}, inventory.ErrInFlight},
		{"new key, set incomplete", inventory.TakeKey{Key: "b"}, inventory.ErrCheck},
		{"new key, checked", inventory.TakeKey{Key: "b", Checked: true}, inventory.ErrShort},
		{"no key", inventory.TakeKey{}, inventory.ErrShort},
	} {
		if err := take("order:key:"+tc.key.Key, tc.key); !errors.Is(err, tc.want) {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}

	// MySQL holds m (taken for before the gate's Redis lost its data).
	var loads int
	load := func(context.Context) ([]string, bool, error) { loads++; return []string{"m"}, true, nil }
	if ok, err := g.CompleteKeys(ctx, time.Hour, load); err != nil || !ok {
		t.Fatalf("complete keys: %v %v", ok, err)
	}
	if ok, err := g.CompleteKeys(ctx, time.Hour, load); err != nil || !ok || loads != 1 {
		t.Fatalf("complete keys again: %v %v, %d loads, want 1", ok, err, loads)
	}
	for _, tc := range []struct {
		key  string
		want error
	}{{"a", inventory.ErrKnown}, {"m", inventory.ErrKnown}, {"b", inventory.ErrShort}} {
		if err := take("order:key:"+tc.key, inventory.TakeKey{Key: tc.key}); !errors.Is(err, tc.want) {
			t.Fatalf("complete set, key %s: %v, want %v", tc.key, err, tc.want)
		}
	}
	// Too many keys to hold: the set stays incomplete.
	g2 := inventory.NewGate(rdb, prefix, "db2")
	if err := g2.Seed(ctx, "S", 0); err != nil {
		t.Fatal(err)
	}
	if ok, err := g2.CompleteKeys(ctx, time.Hour, func(context.Context) ([]string, bool, error) { return nil, false, nil }); !errors.Is(err, inventory.ErrTooManyKeys) || ok {
		t.Fatalf("complete keys with too many: %v %v, want false, ErrTooManyKeys", ok, err)
	}
	if err := g2.Take(ctx, "t", "e", time.Now(), inventory.TakeKey{Key: "x"}, lines); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("incomplete set: %v, want ErrCheck", err)
	}
	// The queue looks a new key up first while the set is incomplete, in
	// stock or not: nothing after its accept would.
	if err := g2.Reset(ctx, "S", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := g2.Queue().Accept(ctx, inventory.Queued{ID: "o0", SKU: "S", Quantity: 1, Key: "x"}, false); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("accept under a new key, incomplete set: %v, want ErrCheck", err)
	}

	// A hold's key naming a queued order.
	q := g.Queue()
	if err := g.Reset(ctx, "S", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Accept(ctx, inventory.Queued{ID: "o1", SKU: "S", Quantity: 1, Key: "q"}, false); err != nil {
		t.Fatal(err)
	}
	if err := take("hold:key:q", inventory.TakeKey{Key: "q", Hold: true, Checked: true}); !errors.Is(err, inventory.ErrKeyQueued) {
		t.Fatalf("hold under a queued order's key: %v, want ErrKeyQueued", err)
	}
	if _, err := q.Accept(ctx, inventory.Queued{ID: "o2", SKU: "S", Quantity: 1, Key: "a"}, false); !errors.Is(err, inventory.ErrKnown) {
		t.Fatalf("accept under a key the gate took for: %v, want ErrKnown", err)
	}

	// The gate's Redis loses its data: a reseeded gate has no complete set
	// until it is loaded again, and a load whose MySQL read raced the loss
	// adds nothing (the key taken for before the loss may be missing).
	flush := func() { loseData(t, rdb, prefix) }
	flush()
	if err := g.Seed(ctx, "S", 0); err != nil {
		t.Fatal(err)
	}
	if err := take("order:key:b", inventory.TakeKey{Key: "b"}); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("reseeded gate, key b: %v, want ErrCheck", err)
	}
	ok, err := g.CompleteKeys(ctx, time.Hour, func(context.Context) ([]string, bool, error) {
		flush() // lost again while MySQL was read
		if err := g.Seed(ctx, "S", 0); err != nil {
			t.Fatal(err)
		}
		return []string{"a", "m"}, true, nil
	})
	if err != nil || ok {
		t.Fatalf("complete keys across a loss: %v %v, want false", ok, err)
	}
	if err := take("order:key:b", inventory.TakeKey{Key: "b"}); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("after a load that raced a loss, key b: %v, want ErrCheck", err)
	}
	if ok, err := g.CompleteKeys(ctx, time.Hour, load); err != nil || !ok {
		t.Fatalf("complete keys after the loss: %v %v", ok, err)
	}
	if err := take("order:key:m", inventory.TakeKey{Key: "m"}); !errors.Is(err, inventory.ErrKnown) {
		t.Fatalf("reloaded set, key m: %v, want ErrKnown", err)
	}
	if err := take("order:key:b", inventory.TakeKey{Key: "b"}); !errors.Is(err, inventory.ErrShort) {
		t.Fatalf("reloaded set, key b: %v, want ErrShort", err)
	}

	// A set completed on another Redis process (what a restart from its
	// persistence, or a promoted replica, keeps: it may have lost the
	// latest keys) is not trusted, and is loaded again.
	if err := rdb.Set(ctx, prefix+"{db:gate}:keys:complete", "c:0123abcd:0", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := take("order:key:b", inventory.TakeKey{Key: "b"}); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("set of another process, key b: %v, want ErrCheck", err)
	}
	loads = 0
	if ok, err := g.CompleteKeys(ctx, time.Hour, load); err != nil || !ok || loads != 1 {
		t.Fatalf("complete keys after a change of process: %v %v, %d loads, want 1", ok, err, loads)
	}
	if err := take("order:key:b", inventory.TakeKey{Key: "b"}); !errors.Is(err, inventory.ErrShort) {
		t.Fatalf("loaded again, key b: %v, want ErrShort", err)
	}
}

// A take made before the gate's Redis lost its data may commit after the
// set was loaded again from MySQL: its settle adds its key (the flow's
// done, a back-check's, the queue's), so its replay at sell-out is looked
// up, not answered short. The load itself waits its bound after the set
// was found incomplete, for the flows that die between commit and settle;
// a set completed on another Redis process is not trusted by the take;
// a reset empties the set.
func TestGateKeysAfterLoss(t *testing.T) {
	g, rdb, prefix := gateOn(t)
	ctx := t.Context()
	lines := []inventory.Line{{SKU: "S", Quantity: 1}}
	none := func(context.Context) ([]string, bool, error) { return nil, true, nil }
	take := func(key string) error {
		return g.Take(ctx, "order:key:"+key, "e", time.Now().Add(time.Hour), inventory.TakeKey{Key: key}, lines)
	}
	flush := func() { // the gate's Redis loses its data; MySQL's stock is 1
		t.Helper()
		loseData(t, rdb, prefix)
		if err := g.Seed(ctx, "S", 1); err != nil {
			t.Fatal(err)
		}
	}
	complete := func() {
		t.Helper()
		if ok, err := g.CompleteKeys(ctx, time.Hour, none); err != nil || !ok {
			t.Fatalf("complete keys: %v %v", ok, err)
		}
	}
	if err := g.Seed(ctx, "S", 1); err != nil {
		t.Fatal(err)
	}
	complete()

	// The flow's done, after a loss; a back-check's, after a reset of the
	// set (a loss takes the pending take with it: no back-check sees it).
	for _, c := range []struct {
		lose   func()
		settle func(key string) error
	}{{flush, func(key string) error {
		_, err := g.Done(ctx, "order:key:"+key, lines)
		return err
	}}, {func() {
		if err := g.ResetKeys(ctx); err != nil {
			t.Fatal(err)
		}
		if err := g.Reset(ctx, "S", 2); err != nil { // held 1, stock 1
			t.Fatal(err)
		}
	}, func(key string) error {
		_, err := g.Settle(ctx, inventory.Pending{Tag: "order:key:" + key, Entry: "e"}, true, lines)
		return err
	}}} {
		key := "k" + strconv.Itoa(rand.Int())
		if err := take(key); err != nil {
			t.Fatal(err)
		}
		c.lose()
		complete() // MySQL has no key yet
		if err := take("new"); err != nil {
			t.Fatal(err) // the last unit: sold out
		}
		if err := c.settle(key); err != nil { // the take before commits
			t.Fatal(err)
		}
		if err := take(key); !errors.Is(err, inventory.ErrKnown) {
			t.Fatalf("replay at sell-out of a key committed after the load: %v, want ErrKnown", err)
		}
		flush()
		complete()
	}

	// The queue's settle, confirmed or rejected: MySQL holds the key.
	q := g.Queue()
	if err := g.Reset(ctx, "S", 2); err != nil {
		t.Fatal(err)
	}
	var settled []inventory.Settled
	for i, key := range []string{"q1", "q2"} {
		o := inventory.Queued{ID: key, SKU: "S", Quantity: 1, Key: key}
		if _, err := q.Accept(ctx, o, false); err != nil {
			t.Fatal(err)
		}
		settled = append(settled, inventory.Settled{Delivery: inventory.Delivery{Entry: "0-1", Order: o}, Confirmed: i == 0})
	}
	flush()
	complete()
	if err := g.Reset(ctx, "S", 0); err != nil {
		t.Fatal(err)
	}
	if err := q.Settle(ctx, "S", settled, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"q1", "q2"} {
		if _, err := q.Accept(ctx, inventory.Queued{ID: "x", SKU: "S", Quantity: 1, Key: key}, false); !errors.Is(err, inventory.ErrKnown) {
			t.Fatalf("queued order %s settled after the load, accept again at sell-out: %v, want ErrKnown", key, err)
		}
	}

	// The set is loaded once more, a flow's bound after it was found
	// incomplete: a take before the loss whose replica died between its
	// commit and its settle is in MySQL by then.
	flush()
	if err := take("new"); err != nil {
		t.Fatal(err)
	}
	var loads int
	mysql := []string{}
	load := func(context.Context) ([]string, bool, error) { loads++; return mysql, true, nil }
	completeWith := func(bound time.Duration, wantLoads int) {
		t.Helper()
		loads = 0
		if ok, err := g.CompleteKeys(ctx, bound, load); err != nil || !ok || loads != wantLoads {
			t.Fatalf("complete keys (bound %v): %v %v, %d loads, want %d", bound, ok, err, loads, wantLoads)
		}
	}
	completeWith(time.Hour, 1)
	mysql = []string{"died"} // committed now, never settled
	completeWith(time.Hour, 0)
	completeWith(0, 1) // the bound has passed: loaded again
	if err := take("died"); !errors.Is(err, inventory.ErrKnown) {
		t.Fatalf("replay at sell-out of a key committed after the first load: %v, want ErrKnown", err)
	}
	completeWith(0, 0) // once
	if err := take("other"); !errors.Is(err, inventory.ErrShort) {
		t.Fatalf("short under a new key, set complete: %v, want ErrShort", err)
	}

	// Completed on another process (a restart from persistence, a promoted
	// replica: the latest keys may be lost): the take does not trust it,
	// and the set is loaded again, and once more after the bound.
	if err := rdb.Set(ctx, prefix+"{db:gate}:keys:complete", "c:0123abcd:0", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := take("other"); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("set completed on another process: %v, want ErrCheck", err)
	}
	completeWith(time.Hour, 1)
	completeWith(0, 1)
	completeWith(0, 0)

	// Too many keys to load again: the set is not complete any more.
	flush()
	completeWith(time.Hour, 1)
	if ok, err := g.CompleteKeys(ctx, 0, func(context.Context) ([]string, bool, error) { return nil, false, nil }); !errors.Is(err, inventory.ErrTooManyKeys) || ok {
		t.Fatalf("load again with too many keys: %v %v, want incomplete, ErrTooManyKeys", ok, err)
	}
	if err := take("new"); err != nil {
		t.Fatal(err)
	}
	if err := take("other"); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("short, set not loaded again: %v, want ErrCheck", err)
	}

	// A reset empties the set: a key taken for and never committed is
	// gone once the set is loaded again.
	if err := g.Reset(ctx, "S", 5); err != nil { // takes in flight hold some
		t.Fatal(err)
	}
	if err := take("z"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.GiveBack(ctx, "order:key:z", lines); err != nil {
		t.Fatal(err)
	}
	if err := g.Reset(ctx, "S", 0); err != nil {
		t.Fatal(err)
	}
	if err := g.ResetKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if err := take("z"); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("after a reset of the set: %v, want ErrCheck", err)
	}
	complete()
	if err := take("z"); !errors.Is(err, inventory.ErrShort) {
		t.Fatalf("reloaded set without z: %v, want ErrShort", err)
	}
	if n, err := rdb.SCard(ctx, prefix+"{db:gate}:keys").Result(); err != nil || n != 0 {
		t.Fatalf("key set holds %d keys (%v), want 0", n, err)
	}
}

// A Redis restarted from its persistence has lost the writes after its
// last snapshot, the keys taken for then among them, and kept the set's
// flag: a sold-out take under such a key is looked up (ErrCheck), from the
// first request after the restart, not answered short.
func TestGateKeysRestartFromPersistence(t *testing.T) {
	srv, err := testbed.StartRedis(t.Context(), testbed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	g := inventory.NewGate(rdb, "", "db")
	ctx := t.Context()
	take := keyedGate(t, g, 1)
	if err := rdb.Save(ctx).Err(); err != nil { // the last snapshot
		t.Fatal(err)
	}
	if err := take("late"); err != nil { // then committed in MySQL
		t.Fatal(err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Reset(ctx, "S", 0); err != nil { // sold out
		t.Fatal(err)
	}
	if err := take("late"); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("replay after a restart that lost its key: %v, want ErrCheck", err)
	}
}

// A Redis that lost its role without restarting (a partition, then a
// failover), took under a key meanwhile, resynced from the promoted
// replica (losing that key) and was promoted again keeps its run_id and
// the set's flag: a sold-out take under the lost key is looked up
// (ErrCheck), not answered short. Its replication history changed at the
// promotion, and the flag names it.
func TestGateKeysFailback(t *testing.T) {
	ctx := t.Context()
	x, err := testbed.StartRedis(ctx, testbed.Options{Args: []string{"--repl-diskless-sync-delay", "0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Stop() })
	xHost, xPort, _ := net.SplitHostPort(x.Addr)
	y, err := testbed.StartRedis(ctx, testbed.Options{Args: []string{"--replicaof", xHost, xPort, "--repl-diskless-sync-delay", "0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { y.Stop() })
	rx := redis.NewClient(&redis.Options{Addr: x.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rx.Close() })
	ry := redis.NewClient(&redis.Options{Addr: y.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { ry.Close() })
	synced := func(rc *redis.Client) {
		t.Helper()
		for !strings.Contains(rc.Info(ctx, "replication").Val(), "master_link_status:up") {
			select {
			case <-ctx.Done():
				t.Fatal("the replica did not sync")
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	runID := func() string {
		return regexp.MustCompile(`run_id:(\w+)`).FindStringSubmatch(rx.Info(ctx, "server").Val())[1]
	}
	synced(ry)
	g := inventory.NewGate(rx, "", "db")
	take := keyedGate(t, g, 1)
	if n, err := rx.Do(ctx, "WAIT", 1, 0).Int(); err != nil || n != 1 { // Y holds the flag
		t.Fatalf("wait for the replica: %d %v", n, err)
	}
	// A partition: Y is promoted; X, cut off, still takes as a master.
	if err := ry.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	if err := take("lost"); err != nil { // then committed in MySQL
		t.Fatal(err)
	}
	// X rejoins as Y's replica, resyncs, and is promoted again.
	id := runID()
	yHost, yPort, _ := net.SplitHostPort(y.Addr)
	if err := rx.ReplicaOf(ctx, yHost, yPort).Err(); err != nil {
		t.Fatal(err)
	}
	synced(rx)
	if err := rx.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	if runID() != id {
		t.Fatal("X restarted: not the failback this test is about")
	}
	if err := g.Reset(ctx, "S", 0); err != nil { // sold out
		t.Fatal(err)
	}
	if err := take("lost"); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("replay after a failback that lost its key: %v, want ErrCheck", err)
	}
	// The queue's accept reads the flag as the take does.
	if _, err := g.Queue().Accept(ctx, inventory.Queued{ID: "o1", SKU: "S", Quantity: 1, Key: "lost"}, false); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("queued replay after a failback that lost its key: %v, want ErrCheck", err)
	}
}

// A master demoted and not yet synced (here: a replica of a master it
// cannot reach) serves its stale data under its own ids, the flag's: a
// balancer or client still routing to it must not be answered short
// without MySQL, for a take or a queued accept.
func TestGateKeysNotTrustedOnAReplica(t *testing.T) {
	ctx := t.Context()
	x, err := testbed.StartRedis(ctx, testbed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Stop() })
	rx := redis.NewClient(&redis.Options{Addr: x.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rx.Close() })
	g := inventory.NewGate(rx, "", "db")
	takeKey := keyedGate(t, g, 0) // sold out
	take := func() error { return takeKey("new") }
	if err := take(); !errors.Is(err, inventory.ErrShort) {
		t.Fatalf("on the master: %v, want ErrShort (the set is complete)", err)
	}
	// Demoted: a replica of a master that is not there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	if err := rx.ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	if err := take(); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("on the demoted master: %v, want ErrCheck", err)
	}
	if _, err := g.Queue().Accept(ctx, inventory.Queued{ID: "o1", SKU: "S", Quantity: 1, Key: "new"}, false); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("queued accept on the demoted master: %v, want ErrCheck", err)
	}
}
