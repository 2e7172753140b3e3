package order_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// TestAPI walks every route and status of docs/design.md through the real echo
// handler on real MariaDB and Redis.
func TestAPI(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	svc := f.service(local.New(), order.Config{Lock: "local", AdminToken: adminToken})
	h := svc.Handler()
	f.stock("apple", 5)

	// POST: 201, the order, and its Location.
	rec := post(h, "apple", 2, "Idempotency-Key", "k1")
	if rec.Code != http.StatusCreated {
		t.Fatalf("POST = %d %s, want 201", rec.Code, rec.Body)
	}
	var fields map[string]any
	json.Unmarshal(rec.Body.Bytes(), &fields)
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"created_at", "id", "instance", "lock", "quantity", "sku", "status", "token"}; !slices.Equal(keys, want) {
		t.Errorf("order fields %v, want %v", keys, want)
	}
	o := decodeOrder(t, rec)
	if o.SKU != "apple" || o.Quantity != 2 || o.Status != "confirmed" || o.Instance != "r1" || o.Lock != "local" || o.Token == 0 || o.CreatedAt.IsZero() {
		t.Errorf("order %+v", o)
	}
	if loc := rec.Header().Get("Location"); loc != "/v1/orders/"+o.ID {
		t.Errorf("Location %q", loc)
	}

	// The same key again: 200, the same order, byte for byte.
	again := post(h, "apple", 2, "Idempotency-Key", "k1")
	if again.Code != http.StatusOK || again.Body.String() != rec.Body.String() {
		t.Errorf("replay = %d %s, want 200 %s", again.Code, again.Body, rec.Body)
	}

	// GET the order: 200, the same order.
	got := call(h, http.MethodGet, "/v1/orders/"+o.ID, "")
	if got.Code != http.StatusOK || got.Body.String() != rec.Body.String() {
		t.Errorf("GET order = %d %s, want 200 %s", got.Code, got.Body, rec.Body)
	}

	// GET inventory: 200 {"sku","stock","reserved","version"} from MySQL.
	inv := call(h, http.MethodGet, "/v1/inventory/apple", "")
	if inv.Code != http.StatusOK || strings.TrimSpace(inv.Body.String()) != `{"sku":"apple","stock":3,"reserved":0,"version":2}` {
		t.Errorf("GET inventory = %d %s", inv.Code, inv.Body)
	}

	// PUT inventory: 200, the version grows, the cache follows.
	put := call(h, http.MethodPut, "/v1/inventory/apple", `{"stock": 1}`, "Authorization", "Bearer "+adminToken)
	if put.Code != http.StatusOK || strings.TrimSpace(put.Body.String()) != `{"sku":"apple","stock":1,"reserved":0,"version":3}` {
		t.Errorf("PUT inventory = %d %s", put.Code, put.Body)
	}
	created := call(h, http.MethodPut, "/v1/inventory/pear", `{"stock":0}`, "Authorization", "Bearer "+adminToken)
	if created.Code != http.StatusOK || strings.TrimSpace(created.Body.String()) != `{"sku":"pear","stock":0,"reserved":0,"version":1}` {
		t.Errorf("PUT new inventory = %d %s", created.Code, created.Body)
	}

	// The business errors.
	for _, c := range []struct {
		name   string
		rec    func() (int, string)
		status int
		code   string
	}{
		{"out of stock (from the refreshed cache)", func() (int, string) { r := post(h, "apple", 2); return r.Code, errorCode(t, r) }, 409, "out_of_stock"},
		{"out of stock at zero", func() (int, string) { r := post(h, "pear", 1); return r.Code, errorCode(t, r) }, 409, "out_of_stock"},
		{"unknown sku", func() (int, string) { r := post(h, "nope", 1); return r.Code, errorCode(t, r) }, 404, "unknown_sku"},
		{"unknown order", func() (int, string) {
			r := call(h, http.MethodGet, "/v1/orders/0190a5c8-0000-7000-8000-000000000000", "")
			return r.Code, errorCode(t, r)
		}, 404, "not_found"},
		{"malformed order id", func() (int, string) {
			r := call(h, http.MethodGet, "/v1/orders/x'%20OR%201=1--", "")
			return r.Code, errorCode(t, r)
		}, 404, "not_found"},
		{"unknown inventory", func() (int, string) {
			r := call(h, http.MethodGet, "/v1/inventory/nope", "")
			return r.Code, errorCode(t, r)
		}, 404, "unknown_sku"},
		{"SQL-like inventory", func() (int, string) {
			r := call(h, http.MethodGet, "/v1/inventory/x'%20OR%201=1--", "")
			return r.Code, errorCode(t, r)
		}, 404, "unknown_sku"},
		{"no route", func() (int, string) { r := call(h, http.MethodGet, "/v2/nothing", ""); return r.Code, errorCode(t, r) }, 404, "not_found"},
		{"wrong method", func() (int, string) {
			r := call(h, http.MethodDelete, "/v1/orders", "")
			if allow := r.Header().Get("Allow"); allow != "POST" {
				t.Errorf("405 with Allow %q, want POST", allow)
			}
			return r.Code, errorCode(t, r)
		}, 405, "invalid_request"},
		{"OPTIONS", func() (int, string) {
			r := call(h, http.MethodOptions, "/v1/inventory/apple", "")
			if allow := r.Header().Get("Allow"); allow != "GET, PUT" {
				t.Errorf("405 with Allow %q, want GET, PUT", allow)
			}
			return r.Code, errorCode(t, r)
		}, 405, "invalid_request"},
		{"OPTIONS on no route", func() (int, string) {
			r := call(h, http.MethodOptions, "/v2/nothing", "")
			return r.Code, errorCode(t, r)
		}, 404, "not_found"},
	} {
		if status, code := c.rec(); status != c.status || code != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, status, code, c.status, c.code)
		}
	}
	if a := f.audit("apple"); a.Stock != 1 || a.Orders != 1 {
		t.Errorf("apple: %+v, want stock 1 and one order", a)
	}

	// Operability routes.
	if r := call(h, http.MethodGet, "/healthz", ""); r.Code != 200 || strings.TrimSpace(r.Body.String()) != `{"status":"ok"}` {
		t.Errorf("healthz = %d %s", r.Code, r.Body)
	}
	if r := call(h, http.MethodGet, "/readyz", ""); r.Code != 200 {
		t.Errorf("readyz = %d %s", r.Code, r.Body)
	}
	metrics := call(h, http.MethodGet, "/metrics", "").Body.String()
	for _, want := range []string{
		`oversold_orders_total{guard="version",lock="local",outcome="created",replica="r1"} 1`,
		`oversold_orders_total{guard="version",lock="local",outcome="replayed",replica="r1"} 1`,
		`oversold_orders_total{guard="version",lock="local",outcome="out_of_stock",replica="r1"} 2`,
		`oversold_orders_total{guard="version",lock="local",outcome="unknown_sku",replica="r1"} 1`,
		`oversold_lock_wait_seconds_count{lock="local",replica="r1"}`,
		`oversold_lock_hold_seconds_bucket{lock="local",replica="r1",le="0.0001"}`,
		`oversold_lock_renewals_failed_total{lock="local",replica="r1"} 0`,
		`oversold_lock_leases_lost_total{lock="local",replica="r1"} 0`,
		`oversold_guard_conflicts_total{guard="version",replica="r1"} 0`,
		`go_goroutines{replica="r1"}`,
		`process_cpu_seconds_total{replica="r1"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestBadInput: every bad input is a 4xx JSON error with a code, and MySQL
// is untouched afterwards.
func TestBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.service(local.New(), order.Config{Lock: "local", AdminToken: adminToken}).Handler()
	f.stock("a", 10)
	auth := []string{"Authorization", "Bearer " + adminToken}
	padded := `{"sku":"a","quantity":1}` + strings.Repeat(" ", 100<<10)               // valid JSON, 100 KB
	bigField := `{"sku":"a","quantity":1,"x":"` + strings.Repeat("x", 100<<10) + `"}` // 100 KB

	cases := []struct {
		name        string
		method      string
		path        string
		contentType string // "" = application/json
		body        string
		header      []string
		status      int
		code        string
	}{
		{name: "zero quantity", body: `{"sku":"a","quantity":0}`},
		{name: "negative quantity", body: `{"sku":"a","quantity":-1}`},
		{name: "fractional quantity", body: `{"sku":"a","quantity":1.5}`},
		{name: "fractional zero", body: `{"sku":"a","quantity":1.0}`},
		{name: "exponent quantity", body: `{"sku":"a","quantity":1e2}`},
		{name: "string quantity", body: `{"sku":"a","quantity":"1"}`},
		{name: "quantity over 1000", body: `{"sku":"a","quantity":1001}`},
		{name: "quantity 1e9", body: `{"sku":"a","quantity":1000000000}`},
		{name: "huge quantity", body: `{"sku":"a","quantity":99999999999999999999999999}`},
		{name: "null quantity", body: `{"sku":"a","quantity":null}`},
		{name: "boolean quantity", body: `{"sku":"a","quantity":true}`},
		{name: "missing quantity", body: `{"sku":"a"}`},
		{name: "empty sku", body: `{"sku":"","quantity":1}`},
		{name: "spaced sku", body: `{"sku":" a","quantity":1}`},
		{name: "inner space sku", body: `{"sku":"a b","quantity":1}`},
		{name: "over-long sku", body: `{"sku":"` + strings.Repeat("a", 65) + `","quantity":1}`},
		{name: "SQL-like sku", body: `{"sku":"x' OR 1=1--","quantity":1}`},
		{name: "non-ASCII sku", body: `{"sku":"äpfel","quantity":1}`},
		{name: "number sku", body: `{"sku":1,"quantity":1}`},
		{name: "null sku", body: `{"sku":null,"quantity":1}`},
		{name: "missing sku", body: `{"quantity":1}`},
		{name: "malformed JSON", body: `{"sku":"a","quantity":`},
		{name: "not JSON", body: `sku=a&quantity=1`},
		{name: "array", body: `[{"sku":"a","quantity":1}]`},
		{name: "null body", body: `null`},
		{name: "empty body", body: ``},
		{name: "trailing garbage", body: `{"sku":"a","quantity":1}x`},
		{name: "two objects", body: `{"sku":"a","quantity":1}{"sku":"a","quantity":1}`},
		{name: "unknown field", body: `{"sku":"a","quantity":1,"price":0}`},
		{name: "field in other case", body: `{"SKU":"a","quantity":1}`},
		{name: "100 KB of whitespace", body: padded},
		{name: "100 KB field", body: bigField},
		{name: "text/plain", contentType: "text/plain", body: `{"sku":"a","quantity":1}`},
		{name: "no content type", contentType: "none", body: `{"sku":"a","quantity":1}`},
		{name: "over-long idempotency key", body: `{"sku":"a","quantity":1}`, header: []string{"Idempotency-Key", strings.Repeat("k", 256)}},
		{name: "control char idempotency key", body: `{"sku":"a","quantity":1}`, header: []string{"Idempotency-Key", "a\tb"}},

		{name: "PUT without token", method: "PUT", body: `{"stock":5}`, header: []string{}, status: 401, code: "unauthorized"},
		{name: "PUT wrong token", method: "PUT", body: `{"stock":5}`, header: []string{"Authorization", "Bearer nope"}, status: 401, code: "unauthorized"},
		{name: "PUT token prefix", method: "PUT", body: `{"stock":5}`, header: []string{"Authorization", "Bearer " + adminToken[:3]}, status: 401, code: "unauthorized"},
		{name: "PUT basic auth", method: "PUT", body: `{"stock":5}`, header: []string{"Authorization", "Basic " + adminToken}, status: 401, code: "unauthorized"},
		{name: "PUT negative stock", method: "PUT", body: `{"stock":-1}`, header: auth},
		{name: "PUT fractional stock", method: "PUT", body: `{"stock":2.5}`, header: auth},
		{name: "PUT string stock", method: "PUT", body: `{"stock":"5"}`, header: auth},
		{name: "PUT stock over 1e9", method: "PUT", body: `{"stock":1000000001}`, header: auth},
		{name: "PUT unknown field", method: "PUT", body: `{"stock":5,"version":9}`, header: auth},
		{name: "PUT text/plain", method: "PUT", contentType: "text/plain", body: `{"stock":5}`, header: auth},
		{name: "PUT 100 KB", method: "PUT", body: `{"stock":5}` + strings.Repeat(" ", 100<<10), header: auth},
		{name: "PUT SQL-like sku", method: "PUT", path: "/v1/inventory/x'%20OR%201=1--", body: `{"stock":5}`, header: auth},
		{name: "PUT over-long sku", method: "PUT", path: "/v1/inventory/" + strings.Repeat("a", 65), body: `{"stock":5}`, header: auth},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			method, path := http.MethodPost, "/v1/orders"
			if c.method == "PUT" {
				method, path = http.MethodPut, "/v1/inventory/a"
			}
			if c.path != "" {
				path = c.path
			}
			header := append([]string{"Content-Type", "application/json"}, c.header...)
			switch c.contentType {
			case "none":
				header = append(header[:0:0], c.header...)
				header = append(header, "Content-Type", "")
			case "":
			default:
				header = append(header, "Content-Type", c.contentType)
			}
			rec := call(h, method, path, c.body, header...)
			status, code := c.status, c.code
			if status == 0 {
				status, code = http.StatusBadRequest, "invalid_request"
			}
			if got := errorCode(t, rec); rec.Code != status || got != code {
				t.Errorf("%d %s (%s), want %d %s", rec.Code, got, rec.Body, status, code)
			}
		})
	}
	if a := f.audit("a"); a.Stock != 10 || a.Orders != 0 {
		t.Errorf("after bad input: %+v, want stock 10 and no orders", a)
	}
	inv, err := f.store.Inventory(t.Context(), "a")
	if err != nil || inv.Version != 1 {
		t.Errorf("inventory %+v, %v: want version 1, untouched", inv, err)
	}
}

// TestAdminDisabled: without OVERSOLD_ADMIN_TOKEN, no token opens PUT.
func TestAdminDisabled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.service(nil, order.Config{}).Handler()
	for _, token := range []string{"", "Bearer ", "Bearer " + adminToken} {
		rec := call(h, http.MethodPut, "/v1/inventory/a", `{"stock":1}`, "Authorization", token)
		if code := errorCode(t, rec); rec.Code != 401 || code != "unauthorized" {
			t.Errorf("token %q: %d %s, want 401 unauthorized", token, rec.Code, code)
		}
	}
	if _, err := f.store.Inventory(t.Context(), "a"); err != storage.ErrUnknownSKU {
		t.Errorf("inventory: %v, want none created", err)
	}
}

// TestLockAndGuardErrors: lock_timeout, unavailable, lock_lost (three
// ways) and conflict, each with nothing written.
func TestLockAndGuardErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()

	t.Run("lock_timeout", func(t *testing.T) {
		f.stock("held", 5)
		locker := local.New()
		h := f.service(locker, order.Config{Lock: "local", LockWait: 50 * time.Millisecond}).Handler()
		lease, err := locker.Acquire(ctx, "sku/held")
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
		rec := post(h, "held", 1)
		if code := errorCode(t, rec); rec.Code != 503 || code != "lock_timeout" || rec.Header().Get("Retry-After") == "" {
			t.Errorf("%d %s Retry-After %q, want 503 lock_timeout with Retry-After", rec.Code, code, rec.Header().Get("Retry-After"))
		}
		if a := f.audit("held"); a.Stock != 5 || a.Orders != 0 {
			t.Errorf("%+v, want untouched", a)
		}
	})

	t.Run("unavailable", func(t *testing.T) {
		f.stock("down", 5)
		h := f.service(downLocker{}, order.Config{Lock: "redis"}).Handler()
		rec := post(h, "down", 1)
		if code := errorCode(t, rec); rec.Code != 503 || code != "unavailable" || rec.Header().Get("Retry-After") == "" {
			t.Errorf("%d %s, want 503 unavailable with Retry-After", rec.Code, code)
		}
		if r := call(h, http.MethodGet, "/readyz", ""); r.Code != 503 || !strings.Contains(r.Body.String(), "lock redis") {
			t.Errorf("readyz = %d %s, want 503 naming the lock", r.Code, r.Body)
		}
	})

	t.Run("lock_lost before the write", func(t *testing.T) {
		f.stock("lost", 5)
		gone := make(chan struct{})
		close(gone)
		svc := f.service(lostLocker{local.New(), gone}, order.Config{Instance: "lost", Lock: "local"})
		rec := post(svc.Handler(), "lost", 1)
		if code := errorCode(t, rec); rec.Code != 409 || code != "lock_lost" {
			t.Errorf("%d %s, want 409 lock_lost", rec.Code, code)
		}
		if a := f.audit("lost"); a.Stock != 5 || a.Orders != 0 {
			t.Errorf("%+v, want untouched", a)
		}
		metrics := call(svc.Handler(), http.MethodGet, "/metrics", "").Body.String()
		if !strings.Contains(metrics, `oversold_lock_leases_lost_total{lock="local",replica="lost"} 1`) {
			t.Errorf("leases lost not counted")
		}
	})

	t.Run("lock_lost during the work, at the one check", func(t *testing.T) {
		// The lease is lost while the holder works (step 5): the single
		// check before the write sees it, and the before-write hook, which
		// comes after that check, is never reached.
		f.stock("late", 5)
		lose := make(chan struct{})
		var points []order.HookPoint
		hook := func(ctx context.Context, at order.HookPoint, h order.HookInfo) {
			points = append(points, at)
			if at == order.HookAfterRead {
				close(lose)
			}
		}
		svc := f.service(lostLocker{local.New(), lose}, order.Config{Lock: "local", Observers: faultHook(hook)})
		rec := post(svc.Handler(), "late", 1)
		if code := errorCode(t, rec); rec.Code != 409 || code != "lock_lost" {
			t.Errorf("%d %s, want 409 lock_lost", rec.Code, code)
		}
		if a := f.audit("late"); a.Stock != 5 || a.Orders != 0 {
			t.Errorf("%+v, want untouched", a)
		}
		if fmt.Sprint(points) != "[after-read]" {
			t.Errorf("hook points %v, want [after-read] only: the check comes before the before-write hook", points)
		}
	})

	t.Run("lost after the check: only a guard can refuse", func(t *testing.T) {
		// The lease is lost once the write has begun, past the one check:
		// nothing in the flow looks again (a check can only narrow the
		// window), so with guard none the write lands. This is the gap the
		// fencing and version guards close.
		f.stock("past", 5)
		lose := make(chan struct{})
		var points []order.HookPoint
		hook := func(ctx context.Context, at order.HookPoint, h order.HookInfo) { points = append(points, at) }
		svc := f.serviceWith(losingStore{f.openStore(), lose}, nil, lostLocker{local.New(), lose},
			order.Config{Lock: "local", Guard: storage.GuardNone, Observers: faultHook(hook)})
		rec := post(svc.Handler(), "past", 1)
		if rec.Code != 201 {
			t.Errorf("%d %s, want 201: no check after the one before the write", rec.Code, rec.Body)
		}
		if a := f.audit("past"); a.Stock != 4 || a.Orders != 1 {
			t.Errorf("%+v, want the order written", a)
		}
		want := "[after-read before-write before-commit before-cache after-commit]"
		if fmt.Sprint(points) != want {
			t.Errorf("hook points %v, want %s", points, want)
		}
	})

	t.Run("lock_lost from a stale fence", func(t *testing.T) {
		f.stock("fenced", 5)
		// A holder with token 100 wrote last; a fresh local locker's token is 1.
		inv, err := f.store.Inventory(ctx, "fenced")
		if err != nil {
			t.Fatal(err)
		}
		w := storage.Write{Guard: storage.GuardFencing, Orders: []storage.Order{{ID: "0190a5c8-0000-7000-8000-000000000001", SKU: "fenced", Quantity: 1, Status: "confirmed"}}, Stock: 5, Version: inv.Version, Token: 100}
		if _, err := f.store.PlaceOrder(ctx, w, nil); err != nil {
			t.Fatal(err)
		}
		svc := f.service(local.New(), order.Config{Instance: "fence", Lock: "local", Guard: storage.GuardFencing})
		rec := post(svc.Handler(), "fenced", 1)
		if code := errorCode(t, rec); rec.Code != 409 || code != "lock_lost" {
			t.Errorf("%d %s, want 409 lock_lost", rec.Code, code)
		}
		if a := f.audit("fenced"); a.Stock != 4 || a.Orders != 1 {
			t.Errorf("%+v, want only the token-100 order", a)
		}
		metrics := call(svc.Handler(), http.MethodGet, "/metrics", "").Body.String()
		if !strings.Contains(metrics, `oversold_guard_conflicts_total{guard="fencing",replica="fence"} 1`) {
			t.Errorf("stale fence not counted as a guard conflict")
		}
	})

	t.Run("conflict after bounded retries", func(t *testing.T) {
		f.stock("stale", 5)
		svc := f.serviceWith(f.openStore(), func(c order.Cache) order.Cache { return staleCache{c} }, local.New(),
			order.Config{Instance: "stale", Lock: "local", Guard: storage.GuardVersion})
		start := time.Now()
		rec := post(svc.Handler(), "stale", 1)
		if code := errorCode(t, rec); rec.Code != 409 || code != "conflict" {
			t.Errorf("%d %s, want 409 conflict", rec.Code, code)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %v: retries must be bounded", d)
		}
		if a := f.audit("stale"); a.Stock != 5 || a.Orders != 0 {
			t.Errorf("%+v, want untouched", a)
		}
		metrics := call(svc.Handler(), http.MethodGet, "/metrics", "").Body.String()
		if !strings.Contains(metrics, `oversold_guard_conflicts_total{guard="version",replica="stale"} 8`) {
			t.Errorf("want 8 guard conflicts (one per attempt) in\n%s", grep(metrics, "oversold_guard"))
		}
	})
}

func grep(text, substr string) string {
	var out []string
	for line := range strings.SplitSeq(text, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
