package order_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/oversold-lab/oversold/internal/redisconn"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/inventory"
	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

func TestMain(m *testing.M) { testbed.Main(m) }

const adminToken = "s3cret-admin"

// fixture is one MariaDB database and one Redis, shared by the replicas of
// a test; each replica gets connections of its own, as real ones would.
type fixture struct {
	t      *testing.T
	dsn    string
	redis  string
	prefix string
	store  *storage.Store // the test's own view of MySQL
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, dsn: testbed.MySQL(t), redis: testbed.Redis(t), prefix: testbed.Prefix(t) + ":"}
	f.store = f.openStore()
	return f
}

func (f *fixture) openStore() *storage.Store {
	f.t.Helper()
	s, err := storage.Open(f.t.Context(), f.dsn)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { s.Close() })
	return s
}

// service is one replica: locker nil means lock=none.
func (f *fixture) service(locker order.Locker, cfg order.Config) *order.Service {
	f.t.Helper()
	return f.serviceWith(f.openStore(), nil, locker, cfg)
}

// serviceWith lets a test wrap the store or the cache.
func (f *fixture) serviceWith(store order.Store, wrap func(order.Cache) order.Cache, locker order.Locker, cfg order.Config) *order.Service {
	f.t.Helper()
	var cache order.Cache = f.cache()
	if wrap != nil {
		cache = wrap(cache)
	}
	if cfg.Instance == "" {
		cfg.Instance = "r1"
	}
	return order.New(store, cache, locker, cfg)
}

// cache is a replica's view of the stock cache, keyed as orderd keys it.
func (f *fixture) cache() *inventory.Cache {
	f.t.Helper()
	rdb, err := redisconn.Open(f.redis)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { rdb.Close() })
	return inventory.New(rdb, f.prefix, f.store.DatabaseIdentity())
}

// stock creates or resets a SKU in MySQL.
func (f *fixture) stock(sku string, n int64) {
	f.t.Helper()
	if _, err := f.store.PutInventory(f.t.Context(), storage.Put{SKU: sku, Stock: n}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) audit(sku string) storage.Audit {
	f.t.Helper()
	a, err := f.store.Audit(context.WithoutCancel(f.t.Context()), sku)
	if err != nil {
		f.t.Fatal(err)
	}
	return a
}

// call runs one request through the real handler. header is name, value, ...
func call(h http.Handler, method, path, body string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func post(h http.Handler, sku string, q int, header ...string) *httptest.ResponseRecorder {
	body, _ := json.Marshal(map[string]any{"sku": sku, "quantity": q})
	return call(h, http.MethodPost, "/v1/orders", string(body), header...)
}

// errorCode decodes {"error":{"code","message"}} and returns the code, or
// fails the test when the body is not that.
func errorCode(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	var body struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error == nil || body.Error.Code == "" || body.Error.Message == "" {
		t.Fatalf("status %d body %q: not an error JSON with code and message (%v)", rec.Code, rec.Body, err)
	}
	return body.Error.Code
}

func decodeOrder(t *testing.T, rec *httptest.ResponseRecorder) order.Order {
	t.Helper()
	var o order.Order
	if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil {
		t.Fatalf("status %d body %q: %v", rec.Code, rec.Body, err)
	}
	return o
}

// lostLocker grants leases that are lost from the start, or once lose is
// closed.
type lostLocker struct {
	order.Locker
	lose chan struct{}
}

func (l lostLocker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	lease, err := l.Locker.Acquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return lostLease{lease, l.lose}, nil
}

type lostLease struct {
	locking.Lease
	lost chan struct{}
}

func (l lostLease) Lost() <-chan struct{} { return l.lost }

// downLocker is a lock service that cannot be reached.
type downLocker struct{}

func (downLocker) Acquire(ctx context.Context, key string) (locking.Lease, error) {
	return nil, locking.ErrUnavailable
}
func (downLocker) Close() error { return nil }

// staleCache answers every read with version 0: the version guard refuses
// every write based on it. It answers even when Redis is slow (a loaded
// machine trips the cache's breaker, and the flow would read MySQL around
// the cache).
type staleCache struct{ order.Cache }

func (c staleCache) Get(ctx context.Context, sku string, load func(context.Context) (inventory.Item, error)) (inventory.Item, error) {
	item, err := c.Cache.Get(ctx, sku, load)
	if errors.Is(err, inventory.ErrDown) {
		item, err = load(ctx)
	}
	item.Version = 0
	return item, err
}

// losingStore closes lose when the write starts, after the flow's one Lost
// check: nothing in the flow can see it, only a guard.
type losingStore struct {
	order.Store
	lose chan struct{}
}

func (s losingStore) PlaceOrder(ctx context.Context, w storage.Write, beforeCommit func() error) (storage.Inventory, error) {
	close(s.lose)
	return s.Store.PlaceOrder(ctx, w, beforeCommit)
}

// faultHook is a test's fault hook as an observer told only the lab's fault
// points, as orderd's lab build adds it.
func faultHook(fn func(ctx context.Context, at order.HookPoint, h order.HookInfo)) []order.Observer {
	return []order.Observer{order.ObserverFunc(func(ctx context.Context, e order.Event) {
		if e.At.Fault() {
			fn(ctx, e.At, e.HookInfo)
		}
	})}
}
