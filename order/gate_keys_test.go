package order_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// countedConn counts the commands a MySQL client sends: a packet with
// sequence number 0 starts one (COM_QUERY, COM_STMT_EXECUTE, COM_PING...).
type countedConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countedConn) Write(b []byte) (int, error) {
	if len(b) >= 5 && b[3] == 0 {
		c.n.Add(1)
	}
	return c.Conn.Write(b)
}

var countedNets atomic.Int64

// countedStore is a store whose every MySQL command, on any of its
// connections, is counted on the wire: what a path costs, whatever code
// sends it.
func (f *fixture) countedStore(n *atomic.Int64) *storage.Store {
	f.t.Helper()
	cfg, err := mysql.ParseDSN(f.dsn)
	if err != nil {
		f.t.Fatal(err)
	}
	network := cfg.Net
	netName := "counted" + strings.Repeat("x", int(countedNets.Add(1)))
	mysql.RegisterDialContext(netName, func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countedConn{c, n}, nil
	})
	cfg.Net = netName
	s, err := storage.Open(f.t.Context(), cfg.FormatDSN())
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { s.Close() })
	return s
}

// flushGate deletes every key of the test's Redis prefix: what the gate
// sees after its Redis lost its data (a restart without persistence, a
// FLUSHALL), without touching a shared server's other keys.
func (f *fixture) flushGate() {
	f.t.Helper()
	ctx := context.WithoutCancel(f.t.Context())
	rdb := redis.NewClient(&redis.Options{Addr: f.redis})
	defer rdb.Close()
	keys, err := rdb.Keys(ctx, f.prefix+"*").Result()
	if err != nil {
		f.t.Fatal(err)
	}
	if len(keys) == 0 {
		f.t.Fatal("no gate keys to flush")
	}
	if err := rdb.Del(ctx, keys...).Err(); err != nil {
		f.t.Fatal(err)
	}
}

// A keyed order the gate refuses costs no MySQL command at all: the gate
// knows every key MySQL holds, so a new key cannot name anything. Replays
// stay truthful: a committed order's key is answered with its order, also
// after the gate's Redis lost its data (reseeded, its keys loaded again),
// and an order's key used for a hold is 422.
func TestGateSoldOutKeyedCostsNoMySQL(t *testing.T) {
	f := newFixture(t)
	const sku = "gate-keys"
	f.stock(sku, 2)
	var commands atomic.Int64
	svc := f.serviceWith(f.countedStore(&commands), nil, nil, order.Config{Guard: storage.GuardAtomic, Gate: f.gate()})
	h := svc.Handler()
	ids := map[string]string{}
	for _, k := range []string{"k1", "k2"} {
		rec := post(h, sku, 1, "Idempotency-Key", k)
		if rec.Code != http.StatusCreated {
			t.Fatalf("order %s: %d %s", k, rec.Code, rec.Body)
		}
		ids[k] = decodeOrder(t, rec).ID
	}
	soldOut := func(key string) {
		t.Helper()
		commands.Store(0)
		wantCode(t, post(h, sku, 1, "Idempotency-Key", key), http.StatusConflict, "out_of_stock")
		if n := commands.Load(); n != 0 {
			t.Fatalf("a sold-out order under a new key sent %d MySQL commands, want 0", n)
		}
	}
	replays := func() {
		t.Helper()
		for k, id := range ids {
			rec := post(h, sku, 1, "Idempotency-Key", k)
			if rec.Code != http.StatusOK || decodeOrder(t, rec).ID != id {
				t.Fatalf("replay of %s after sell-out: %d %s, want 200 with order %s", k, rec.Code, rec.Body, id)
			}
		}
		wantCode(t, hold(h, 60, "k1", sku, 1), http.StatusUnprocessableEntity, "idempotency_key_reused")
		wantCode(t, post(h, sku, 2, "Idempotency-Key", "k2"), http.StatusUnprocessableEntity, "idempotency_key_reused")
	}
	soldOut("k3")
	replays()
	soldOut("k4")

	// The gate's Redis loses everything: counters, key set, its flag.
	f.flushGate()
	replays() // the first reseeds the counter and loads the keys
	soldOut("k5")
	f.wantSettled(sku)
}

// A hold under the key of an order still in the queue (202, not in MySQL
// yet) is refused as a reused key, and takes nothing.
func TestGateHoldUnderQueuedOrdersKey(t *testing.T) {
	f := newFixture(t)
	const sku = "gate-queued-key"
	f.stock(sku, 5)
	g := f.gate()
	// Not started: it accepts, and nothing consumes the queue.
	svc := f.service(nil, order.Config{Guard: storage.GuardAtomic, Gate: g, Queue: g.Queue()})
	h := svc.Handler()
	rec := post(h, sku, 1, "Idempotency-Key", "q1")
	if rec.Code != http.StatusAccepted {
		t.Fatalf("queued order: %d %s", rec.Code, rec.Body)
	}
	wantCode(t, hold(h, 60, "q1", sku, 1), http.StatusUnprocessableEntity, "idempotency_key_reused")
	if c := f.counter(sku); c.Stock != 4 || c.Held != 1 {
		t.Fatalf("gate counter %+v, want stock 4 held 1 (the queued order's only)", c)
	}
}

// Requests under one key at once, past the last unit of stock: one places
// the order, every other is its replay, none is answered out of stock.
func TestGateSameKeyAtSellOut(t *testing.T) {
	f := newFixture(t)
	const sku = "gate-same-key"
	f.stock(sku, 1)
	var replicas []http.Handler
	for range 3 {
		replicas = append(replicas, f.service(nil, order.Config{Guard: storage.GuardAtomic, Gate: f.gate()}).Handler())
	}
	const clients = 12
	start := make(chan struct{})
	codes := make([]int, clients)
	ids := make([]string, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			<-start
			rec := post(replicas[i%len(replicas)], sku, 1, "Idempotency-Key", "same")
			codes[i] = rec.Code
			if rec.Code < 300 {
				ids[i] = decodeOrder(t, rec).ID
			}
		})
	}
	close(start)
	wg.Wait()
	created := 0
	for i, c := range codes {
		switch {
		case c == http.StatusCreated:
			created++
		case c != http.StatusOK:
			t.Fatalf("client %d: %d, want 201 or 200 (a replay)", i, c)
		}
		if ids[i] != ids[0] {
			t.Fatalf("client %d got order %s, client 0 %s", i, ids[i], ids[0])
		}
	}
	if created != 1 {
		t.Fatalf("%d orders created, want 1", created)
	}
	f.wantSettled(sku)
}

// With the accept queue too, a sold-out order under a new key costs no
// MySQL command, and a replay of a queued order is still its order.
func TestQueueSoldOutKeyedCostsNoMySQL(t *testing.T) {
	f := newFixture(t)
	const sku = "queue-keys"
	f.stock(sku, 1)
	g := f.gate()
	var commands atomic.Int64
	// Not started: it accepts, and nothing consumes the queue.
	svc := f.serviceWith(f.countedStore(&commands), nil, nil, order.Config{Guard: storage.GuardAtomic, Gate: g, Queue: g.Queue()})
	h := svc.Handler()
	rec := post(h, sku, 1, "Idempotency-Key", "q1")
	if rec.Code != http.StatusAccepted {
		t.Fatalf("queued order: %d %s", rec.Code, rec.Body)
	}
	id := decodeOrder(t, rec).ID
	commands.Store(0)
	wantCode(t, post(h, sku, 1, "Idempotency-Key", "q2"), http.StatusConflict, "out_of_stock")
	if n := commands.Load(); n != 0 {
		t.Fatalf("a sold-out order under a new key sent %d MySQL commands, want 0", n)
	}
	if rec := post(h, sku, 1, "Idempotency-Key", "q1"); rec.Code != http.StatusOK || decodeOrder(t, rec).ID != id {
		t.Fatalf("replay of the queued order: %d %s, want 200 with order %s", rec.Code, rec.Body, id)
	}
}

// An order under a hold's key is 422 also when the gate is short: the
// lookup the gate asks for reads reservations too, not orders alone (a
// lookup of orders alone found nothing and answered 409 out_of_stock).
func TestGateOrderUnderHoldKeySoldOut(t *testing.T) {
	f := newFixture(t)
	const sku = "gk-holdkey"
	f.stock(sku, 1)
	h := f.service(nil, order.Config{Guard: storage.GuardAtomic, Gate: f.gate()}).Handler()
	if rec := hold(h, 60, "gk-h1", sku, 1); rec.Code != http.StatusCreated {
		t.Fatalf("hold: %d %s", rec.Code, rec.Body)
	}
	rec := post(h, sku, 1, "Idempotency-Key", "gk-h1")
	if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), "idempotency_key_reused") {
		t.Errorf("an order under a hold's key, the gate short: %d %s, want 422 idempotency_key_reused", rec.Code, rec.Body)
	}
}

// An order whose take came before the gate's Redis lost its data, and
// whose commit comes after the reseeded gate loaded MySQL's keys, is
// still replayed at sell-out (200, not 409): its settle adds its key to
// the set, and if its replica died before settling, the set is loaded
// again once a flow's bound has passed since the first load.
func TestGateReplayOfOrderCommittedAcrossLoss(t *testing.T) {
	for _, dies := range []bool{false, true} {
		t.Run(map[bool]string{false: "settled", true: "replica-died"}[dies], func(t *testing.T) {
			f := newFixture(t)
			sku := "gate-loss-" + map[bool]string{false: "settled", true: "died"}[dies]
			f.stock(sku, 2)
			other := f.service(nil, order.Config{Instance: "other", Guard: storage.GuardAtomic, Gate: f.gate()})
			h := other.Handler()
			hook := func(_ context.Context, at order.HookPoint, _ order.HookInfo) {
				switch {
				case at == order.HookBeforeWrite:
					// Taken: the gate's Redis loses everything; another
					// replica reseeds it (MySQL's stock 2), loads MySQL's
					// keys (k1 is not there yet) and sells one.
					f.flushGate()
					if rec := post(h, sku, 1, "Idempotency-Key", "k2"); rec.Code != http.StatusCreated {
						t.Errorf("order k2 after the loss: %d %s", rec.Code, rec.Body)
					}
				case at == order.HookAfterCommit && dies:
					runtime.Goexit()
				}
			}
			first := f.service(nil, order.Config{Instance: "first", Guard: storage.GuardAtomic, Gate: f.gate(), Observers: faultHook(hook)})
			var id string
			done := make(chan struct{})
			go func() {
				defer close(done)
				o, _, err := first.Place(t.Context(), order.Request{SKU: sku, Quantity: 1, Key: "k1"})
				if err != nil {
					t.Errorf("order k1: %v", err)
				}
				id = o.ID
			}()
			<-done
			if a := f.audit(sku); a.Stock != 0 {
				t.Fatalf("MySQL stock %d, want 0 (k1 and k2 committed)", a.Stock)
			}
			if dies {
				// Its take is lost and never settled: the counter admits
				// one MySQL does not hold until the reconciler.
				if err := other.Reconcile(t.Context()); err != nil {
					t.Fatal(err)
				}
				f.ageGateKeys()
				order.GateKeys(other) // the sweeper's next pass
			}
			if c := f.counter(sku); c.Stock != 0 || c.Held != 0 {
				t.Fatalf("gate counter %+v, want sold out", c)
			}
			rec := post(h, sku, 1, "Idempotency-Key", "k1")
			if rec.Code != http.StatusOK || (id != "" && decodeOrder(t, rec).ID != id) {
				t.Fatalf("replay of k1 at sell-out: %d %s, want 200 with its order", rec.Code, rec.Body)
			}
			wantCode(t, post(h, sku, 1, "Idempotency-Key", "k3"), http.StatusConflict, "out_of_stock")
		})
	}
}

// ageGateKeys makes the gate's key set's first load look a flow's bound
// old, as the sweeper finds it that long after.
func (f *fixture) ageGateKeys() {
	f.t.Helper()
	ctx := context.WithoutCancel(f.t.Context())
	rdb := redis.NewClient(&redis.Options{Addr: f.redis})
	defer rdb.Close()
	keys, err := rdb.Keys(ctx, f.prefix+"*keys:complete").Result()
	if err != nil || len(keys) != 1 {
		f.t.Fatalf("key set flag: %v %v", keys, err)
	}
	flag, err := rdb.Get(ctx, keys[0]).Result()
	i := strings.LastIndexByte(flag, ':')
	if err != nil || !strings.HasPrefix(flag, "c:") || i < 0 {
		f.t.Fatalf("key set flag %q (%v), want complete", flag, err)
	}
	if err := rdb.Set(ctx, keys[0], flag[:i+1]+"1", 0).Err(); err != nil {
		f.t.Fatal(err)
	}
}

// A PUT resets the gate's key set with the counter: loaded again, it
// holds MySQL's keys, not those of takes given back.
func TestGatePutResetsKeySet(t *testing.T) {
	f := newFixture(t)
	const sku = "gate-put-keys"
	f.stock(sku, 2)
	svc := f.service(nil, order.Config{Guard: storage.GuardAtomic, Gate: f.gate()})
	h := svc.Handler()
	if rec := post(h, sku, 1, "Idempotency-Key", "k1"); rec.Code != http.StatusCreated {
		t.Fatalf("order k1: %d %s", rec.Code, rec.Body)
	}
	f.stock(sku, 0) // MySQL sold out behind the gate's back: k2 is taken, then given back
	wantCode(t, post(h, sku, 1, "Idempotency-Key", "k2"), http.StatusConflict, "out_of_stock")
	members := func() []string {
		t.Helper()
		rdb := redis.NewClient(&redis.Options{Addr: f.redis})
		defer rdb.Close()
		ctx := context.WithoutCancel(t.Context())
		keys, err := rdb.Keys(ctx, f.prefix+"*:keys").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("key set: %v %v", keys, err)
		}
		m, err := rdb.SMembers(ctx, keys[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(m)
		return m
	}
	if m := members(); !slices.Equal(m, []string{"k1", "k2"}) {
		t.Fatalf("key set before the PUT: %v, want k1 k2", m)
	}
	if _, err := svc.SetStock(t.Context(), sku, 0, 0); err != nil {
		t.Fatal(err)
	}
	if m := members(); !slices.Equal(m, []string{"k1"}) {
		t.Fatalf("key set after the PUT: %v, want k1 (MySQL's)", m)
	}
	if rec := post(h, sku, 1, "Idempotency-Key", "k1"); rec.Code != http.StatusOK {
		t.Fatalf("replay of k1 after the PUT: %d %s, want 200", rec.Code, rec.Body)
	}
	wantCode(t, post(h, sku, 1, "Idempotency-Key", "k2"), http.StatusConflict, "out_of_stock")
}

// A fleet that comes back after a rollback to a version that commits
// keyed orders without recording their keys does not trust the key set
// its earlier run completed: every replica's Start marks it incomplete,
// and a replay at sell-out of an order the older version committed is
// answered with its order (200), not 409.
func TestGateKeysAfterRollback(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	const sku = "gate-rollback"
	f.stock(sku, 2)
	first := f.service(nil, order.Config{Instance: "new1", Guard: storage.GuardAtomic, Gate: f.gate()})
	if err := first.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := post(first.Handler(), sku, 1, "Idempotency-Key", "k1"); rec.Code != http.StatusCreated {
		t.Fatalf("order k1: %d %s", rec.Code, rec.Body)
	}
	order.GateKeys(first) // complete
	first.Close()
	// Rolled back: the older version commits k2 and records no key (here
	// one without the gate; one with it writes the same to the key set).
	rec := post(f.service(nil, order.Config{Instance: "old", Guard: storage.GuardAtomic}).Handler(), sku, 1, "Idempotency-Key", "k2")
	if rec.Code != http.StatusCreated {
		t.Fatalf("order k2: %d %s", rec.Code, rec.Body)
	}
	id := decodeOrder(t, rec).ID
	// Rolled forward again.
	again := f.service(nil, order.Config{Instance: "new2", Guard: storage.GuardAtomic, Gate: f.gate()})
	if err := again.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { again.Close() })
	if err := again.Reconcile(ctx); err != nil { // the counter follows MySQL: sold out
		t.Fatal(err)
	}
	if c := f.counter(sku); c.Stock != 0 || c.Held != 0 {
		t.Fatalf("gate counter %+v, want sold out", c)
	}
	h := again.Handler()
	if rec := post(h, sku, 1, "Idempotency-Key", "k2"); rec.Code != http.StatusOK || decodeOrder(t, rec).ID != id {
		t.Fatalf("replay of k2 at sell-out: %d %s, want 200 with order %s", rec.Code, rec.Body, id)
	}
	wantCode(t, post(h, sku, 1, "Idempotency-Key", "k3"), http.StatusConflict, "out_of_stock")
}

// supersededOnce is the gate, whose first key-set load another replica's
// start takes over (it marks the set incomplete while the load reads
// MySQL): the load adds nothing.
type supersededOnce struct {
	*inventory.Gate
	done atomic.Bool
}

func (g *supersededOnce) CompleteKeys(ctx context.Context, bound time.Duration, load func(context.Context) ([]string, bool, error)) (bool, error) {
	if g.done.Swap(true) {
		return g.Gate.CompleteKeys(ctx, bound, load)
	}
	return g.Gate.CompleteKeys(ctx, bound, func(ctx context.Context) ([]string, bool, error) {
		if err := g.ForgetKeys(ctx); err != nil {
			return nil, false, err
		}
		return load(ctx)
	})
}

// A load another took over is no failure: the replica's next check loads
// the set at once, not a minute later (a superseded load counted as a
// failed one held back every check and sweeper pass of that replica).
func TestGateKeysLoadAgainAfterSuperseded(t *testing.T) {
	f := newFixture(t)
	const sku = "gk-superseded"
	f.stock(sku, 0)
	g := &supersededOnce{Gate: f.gate()}
	svc := f.service(nil, order.Config{Guard: storage.GuardAtomic, Gate: g})
	ctx := t.Context()
	if err := g.Seed(ctx, sku, 0); err != nil {
		t.Fatal(err)
	}
	lines := []inventory.Line{{SKU: sku, Quantity: 1}}
	take := func() error {
		return g.Take(ctx, "order:key:gk-new", "e", time.Now().Add(time.Hour), inventory.TakeKey{Key: "gk-new"}, lines)
	}
	order.GateKeys(svc) // superseded
	if err := take(); !errors.Is(err, inventory.ErrCheck) {
		t.Fatalf("after the superseded load: %v, want ErrCheck (incomplete)", err)
	}
	order.GateKeys(svc)
	if err := take(); !errors.Is(err, inventory.ErrShort) {
		t.Fatalf("the next check: %v, want ErrShort (the set loaded)", err)
	}
}

// A live replica that does not record the keys it takes for (an older
// version's "redis", an ungated one), started while this replica's row had
// lapsed so Start could not refuse it, keeps the key set incomplete for as
// long as it lives: its keyed orders are looked up in MySQL, not answered
// short from a set that never learns them.
func TestGateKeysIncompleteBesideAReplicaNotRecording(t *testing.T) {
	f := newFixture(t)
	const sku = "gk-unrecorded"
	f.stock(sku, 0)
	g := f.gate()
	svc := f.service(nil, order.Config{Instance: "gk-new", Guard: storage.GuardAtomic, Gate: g})
	ctx := t.Context()
	if err := g.Seed(ctx, sku, 0); err != nil {
		t.Fatal(err)
	}
	lines := []inventory.Line{{SKU: sku, Quantity: 1}}
	take := func() error {
		return g.Take(ctx, "order:key:gk-u", "e", time.Now().Add(time.Hour), inventory.TakeKey{Key: "gk-u"}, lines)
	}
	order.GateKeys(svc)
	if err := take(); !errors.Is(err, inventory.ErrShort) {
		t.Fatalf("alone: %v, want ErrShort (the set complete)", err)
	}
	for _, gate := range []string{"redis", ""} { // an older version's, one older than the gate
		old := storage.Replica{Instance: "gk-old", Lock: "none", Guard: "atomic", Gate: gate}
		if err := f.store.Heartbeat(ctx, old); err != nil {
			t.Fatal(err)
		}
		order.GateKeys(svc)
		if err := take(); !errors.Is(err, inventory.ErrCheck) {
			t.Fatalf("beside a live replica of gate %q: %v, want ErrCheck (incomplete)", gate, err)
		}
		order.GateKeys(svc)
		if err := take(); !errors.Is(err, inventory.ErrCheck) {
			t.Fatalf("beside it, a check later: %v, want ErrCheck (still incomplete)", err)
		}
		if err := f.store.RemoveReplica(ctx, old.Instance); err != nil {
			t.Fatal(err)
		}
		order.GateKeys(svc)
		if err := take(); !errors.Is(err, inventory.ErrShort) {
			t.Fatalf("once it is gone: %v, want ErrShort", err)
		}
	}
}
