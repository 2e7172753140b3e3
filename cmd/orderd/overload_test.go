package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
)

// TestOverload runs the real orderd against slow clients and more requests
// than it takes at once.
func TestOverload(t *testing.T) {
	t.Parallel()
	bin := orderdBinary(t)
	t.Run("slow client", func(t *testing.T) {
		t.Parallel()
		slowClient(t, bin)
	})
	t.Run("in-flight cap", func(t *testing.T) {
		t.Parallel()
		inFlightCap(t, bin)
	})
	t.Run("request deadline", func(t *testing.T) {
		t.Parallel()
		requestDeadline(t, bin)
	})
	t.Run("stalled bodies", func(t *testing.T) {
		t.Parallel()
		stalledBodies(t, bin)
	})
}

// stalledBodies: 500 clients send the headers of a request with a body (an
// order, a hold, a stock reset) and stall the body, more than the
// in-flight cap (150 here; the fault was found at the default, 256). They take no slot: an
// ordinary order among them is 201 at once (before, every slot was taken
// and it was 503 at once), and orderd disconnects each of them within 30 s,
// under a request timeout longer than that (45 s here), selling them
// nothing.
func stalledBodies(t *testing.T, bin string) {
	const (
		stalled = 500
		token   = "stall-token"
		stock   = 100
		// Below each route's share of the stalled clients (166): a route
		// whose handler took its slot before its body would fill the cap
		// on its own.
		capacity = 150
	)
	// This process holds the clients' sockets, orderd its own.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < stalled+200 {
		t.Fatalf("open files limit %d (%v): %d stalled clients need more (ulimit -n)", lim.Cur, err, stalled)
	}
	base := startOrderd(t, command(bin, "OVERSOLD_ADDR=127.0.0.1:0", "OVERSOLD_INSTANCE=stall",
		"OVERSOLD_MYSQL_DSN="+testbed.MySQL(t), "OVERSOLD_REDIS_ADDR="+testbed.Redis(t), "OVERSOLD_LOCK=local",
		"OVERSOLD_REQUEST_TIMEOUT=45s", "OVERSOLD_ADMIN_TOKEN="+token, "OVERSOLD_MAX_IN_FLIGHT="+strconv.Itoa(capacity)))
	addr := strings.TrimPrefix(base, "http://")
	put(t, base, token, "stall-1", stock)

	// Each client sends its headers (Content-Length of an order that never
	// comes) and then nothing. The second half asks for 100 Continue: its
	// interim answer (or a final one) says orderd read its headers and runs
	// its handler, so the ordinary order goes after every stalled one is in.
	type client struct {
		sent     time.Time
		answered chan struct{} // the first byte of an answer, or the close
		closed   chan struct{}
		answer   string
		closedAt time.Time
	}
	// A few more drip their headers for 15 s before they stall: the bound
	// runs from a request's first byte, not from its last header.
	type dripper struct {
		sent   time.Time
		closed chan time.Time
	}
	drippers := make([]dripper, 5)
	for i := range drippers {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dripper %d: %v", i, err)
		}
		t.Cleanup(func() { conn.Close() })
		d := dripper{sent: time.Now(), closed: make(chan time.Time, 1)}
		drippers[i] = d
		go func() {
			io.Copy(io.Discard, conn)
			d.closed <- time.Now()
		}()
		go func() {
			lines := []string{"POST /v1/orders HTTP/1.1\r\n", "Host: x\r\n", "Content-Type: application/json\r\n"}
			for j := range 10 {
				lines = append(lines, "X-Pad-"+strconv.Itoa(j)+": x\r\n")
			}
			lines = append(lines, "Content-Length: 30\r\n\r\n")
			for _, l := range lines {
				if _, err := io.WriteString(conn, l); err != nil {
					return // closed by orderd
				}
				time.Sleep(1500 * time.Millisecond)
			}
		}()
	}

	clients := make([]*client, stalled)
	for i := range clients {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		t.Cleanup(func() { conn.Close() })
		expect := ""
		if i >= stalled/2 {
			expect = "Expect: 100-continue\r\n"
		}
		c := &client{sent: time.Now(), answered: make(chan struct{}), closed: make(chan struct{})}
		clients[i] = c
		// Every route that reads a body, in turn.
		route := []string{"POST /v1/orders", "POST /v1/reservations", "PUT /v1/inventory/stall-1"}[i%3]
		if _, err := io.WriteString(conn, route+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			"Authorization: Bearer "+token+"\r\n"+expect+"Idempotency-Key: stalled-"+strconv.Itoa(i)+"\r\nContent-Length: 30\r\n\r\n"); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		go func() {
			var b strings.Builder
			buf := make([]byte, 512)
			first := true
			for {
				n, err := conn.Read(buf)
				b.Write(buf[:n])
				if first && (n > 0 || err != nil) {
					first = false
					close(c.answered)
				}
				if err != nil {
					break
				}
			}
			c.answer, c.closedAt = b.String(), time.Now()
			close(c.closed)
		}()
	}
	for i, c := range clients[stalled/2:] {
		select {
		case <-c.answered:
		case <-time.After(20 * time.Second):
			t.Fatalf("stalled client %d: orderd did not read its headers in 20 s", stalled/2+i)
		}
	}

	began := time.Now()
	code, _, body := postOrder(base, "stall-1", 1, "ordinary")
	took := time.Since(began)
	t.Logf("an ordinary order among %d stalled bodies: %d in %v", stalled, code, took.Round(time.Millisecond))
	if code != http.StatusCreated || took > 2*time.Second {
		t.Errorf("an ordinary order among %d stalled bodies: %d %s after %v, want 201 in under 2 s", stalled, code, body, took.Round(time.Millisecond))
	}

	var longest time.Duration
	for i, c := range clients {
		select {
		case <-c.closed:
		case <-time.After(time.Until(c.sent.Add(40 * time.Second))):
			t.Fatalf("stalled client %d still connected after 40 s", i)
		}
		held := c.closedAt.Sub(c.sent)
		longest = max(longest, held)
		if held > 30*time.Second {
			t.Errorf("stalled client %d held its connection %v, want at most 30 s", i, held.Round(time.Millisecond))
		}
		if strings.Contains(c.answer, "HTTP/1.1 20") {
			t.Errorf("stalled client %d was answered %q", i, c.answer)
		}
	}
	for i, d := range drippers {
		select {
		case at := <-d.closed:
			held := at.Sub(d.sent)
			longest = max(longest, held)
			if held > 30*time.Second {
				t.Errorf("dripping client %d held its connection %v, want at most 30 s", i, held.Round(time.Millisecond))
			}
		case <-time.After(time.Until(d.sent.Add(45 * time.Second))):
			t.Fatalf("dripping client %d still connected after 45 s", i)
		}
	}
	t.Logf("the last stalled client was disconnected after %v", longest.Round(time.Millisecond))
	if got := inventoryStock(t, base, "stall-1"); got != stock-1 {
		t.Errorf("stock %d, want %d: the ordinary order's alone", got, stock-1)
	}
}

// requestDeadline: OVERSOLD_REQUEST_TIMEOUT (2s) bounds an order's wait
// for its SKU: an order queued behind another's work (3s) is answered 503
// unavailable on its deadline and sells nothing (without the deadline it
// would wait on, for a lock_timeout). The order a batch has taken is answered with the batch's
// outcome, past the timeout: 201, committed (a 503 after its commit would
// tell its client to buy again).
func requestDeadline(t *testing.T, bin string) {
	const token = "deadline-token"
	base := startOrderd(t, command(bin, "OVERSOLD_ADDR=127.0.0.1:0", "OVERSOLD_INSTANCE=deadline",
		"OVERSOLD_MYSQL_DSN="+testbed.MySQL(t), "OVERSOLD_REDIS_ADDR="+testbed.Redis(t), "OVERSOLD_LOCK=local",
		"OVERSOLD_LOCK_WAIT=1s", "OVERSOLD_REQUEST_TIMEOUT=2s", "OVERSOLD_WORK_DELAY=3s", "OVERSOLD_ADMIN_TOKEN="+token))
	put(t, base, token, "late-1", 10)
	taken := make(chan int, 1)
	go func() {
		code, _, _ := postOrder(base, "late-1", 1, "")
		taken <- code
	}()
	for deadline := time.Now().Add(20 * time.Second); batched(t, base) < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first order was not taken by a batch in 20s")
		}
	}
	code, _, body := postOrder(base, "late-1", 1, "")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"unavailable"`) {
		t.Errorf("an order queued past its deadline: %d %s, want 503 unavailable", code, body)
	}
	if code := <-taken; code != http.StatusCreated {
		t.Errorf("the order taken before its deadline: %d, want 201", code)
	}
	if stock := inventoryStock(t, base, "late-1"); stock != 9 {
		t.Errorf("stock %d, want 9: the taken order's alone", stock)
	}
}

// slowClient: a client that sends its request headers, or its headers and
// then its body, one byte every 200ms cannot hold its connection past
// OVERSOLD_REQUEST_TIMEOUT (2s here): orderd closes it.
func slowClient(t *testing.T, bin string) {
	const timeout = 2 * time.Second
	base := startOrderd(t, command(bin, "OVERSOLD_ADDR=127.0.0.1:0", "OVERSOLD_INSTANCE=slow",
		"OVERSOLD_MYSQL_DSN="+testbed.MySQL(t), "OVERSOLD_REDIS_ADDR="+testbed.Redis(t), "OVERSOLD_LOCK=local",
		"OVERSOLD_LOCK_WAIT=1s", "OVERSOLD_REQUEST_TIMEOUT="+timeout.String()))
	addr := strings.TrimPrefix(base, "http://")
	body := `{"sku":"slow-1","quantity":1}` + strings.Repeat(" ", 200)
	for _, c := range []struct{ name, sent, drip string }{
		{"headers", "POST /v1/orders HTTP/1.1\r\n", "Host: x\r\nContent-Type: application/json\r\nX-Pad: " + strings.Repeat("a", 200) + "\r\n\r\n"},
		{"body", "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n", body},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			began := time.Now()
			if _, err := io.WriteString(conn, c.sent); err != nil {
				t.Fatal(err)
			}
			// The reader sees orderd's answer, if any, then the close.
			closed := make(chan string, 1)
			go func() {
				b, _ := io.ReadAll(conn)
				closed <- string(b)
			}()
			var answer string
		drip:
			for i := range len(c.drip) {
				select {
				case answer = <-closed:
					break drip
				case <-time.After(200 * time.Millisecond):
				}
				if _, err := io.WriteString(conn, c.drip[i:i+1]); err != nil {
					answer = <-closed
					break
				}
				if i == len(c.drip)-1 {
					t.Fatalf("orderd let a client drip its %s for %v, past its %v request timeout", c.name, time.Since(began).Round(time.Millisecond), timeout)
				}
			}
			held := time.Since(began)
			if held < timeout-100*time.Millisecond || held > 3*timeout {
				t.Errorf("connection closed after %v, want about the %v request timeout", held, timeout)
			}
			if strings.Contains(answer, "127.0.0.1") {
				t.Errorf("the answer names an address: %q", answer)
			}
		})
	}
}

// inFlightCap: with OVERSOLD_MAX_IN_FLIGHT=4 and 3s of work per order, 16
// orders for 16 SKUs released at once: 4 are served, 12 are refused at once
// (503 unavailable, Retry-After 1 to 3 seconds, all before the first order
// is done: none waited for a slot) and change nothing, and the probes still
// answer while the replica is full.
func inFlightCap(t *testing.T, bin string) {
	const (
		limit   = 4
		clients = 16
		token   = "cap-token"
	)
	base := startOrderd(t, command(bin, "OVERSOLD_ADDR=127.0.0.1:0", "OVERSOLD_INSTANCE=cap",
		"OVERSOLD_MYSQL_DSN="+testbed.MySQL(t), "OVERSOLD_REDIS_ADDR="+testbed.Redis(t), "OVERSOLD_LOCK=local",
		"OVERSOLD_WORK_DELAY=3s", "OVERSOLD_MAX_IN_FLIGHT="+strconv.Itoa(limit), "OVERSOLD_ADMIN_TOKEN="+token))
	sku := func(i int) string { return fmt.Sprintf("cap-%d", i) }
	for i := range clients {
		put(t, base, token, sku(i), 10)
	}

	type answer struct {
		code       int
		retryAfter string
		body       string
		at         time.Time
	}
	answers := make([]answer, clients)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			<-start
			code, h, body := postOrder(base, sku(i), 1, "cap-key-"+strconv.Itoa(i))
			answers[i] = answer{code, h.Get("Retry-After"), body, time.Now()}
		})
	}
	close(start)

	// While the served orders work, the probes answer.
	time.Sleep(time.Second)
	for _, path := range []string{"/readyz", "/healthz", "/metrics"} {
		if res, err := testClient.Get(base + path); err != nil || res.StatusCode != http.StatusOK {
			t.Errorf("GET %s while full: %v %v, want 200", path, res, err)
		} else {
			res.Body.Close()
		}
	}
	wg.Wait()

	var served, refused []int
	var firstServed time.Time
	for i, a := range answers {
		switch a.code {
		case http.StatusCreated:
			served = append(served, i)
			if firstServed.IsZero() || a.at.Before(firstServed) {
				firstServed = a.at
			}
		case http.StatusServiceUnavailable:
			refused = append(refused, i)
			var e struct{ Error struct{ Code string } }
			if json.Unmarshal([]byte(a.body), &e) != nil || e.Error.Code != "unavailable" {
				t.Errorf("refused order %d: %s, want code unavailable", i, a.body)
			}
			if n, err := strconv.Atoi(a.retryAfter); err != nil || n < 1 || n > 3 {
				t.Errorf("refused order %d: Retry-After %q, want 1 to 3", i, a.retryAfter)
			}
		default:
			t.Errorf("order %d: %d %s", i, a.code, a.body)
		}
	}
	if len(served) != limit || len(refused) != clients-limit {
		t.Fatalf("%d served, %d refused, want %d and %d", len(served), len(refused), limit, clients-limit)
	}
	for _, i := range refused {
		if !answers[i].at.Before(firstServed) {
			t.Errorf("refused order %d answered after a served one finished: it waited for a slot", i)
		}
		if stock := inventoryStock(t, base, sku(i)); stock != 10 {
			t.Errorf("refused order %d: %s has stock %d, want 10 (nothing changed)", i, sku(i), stock)
		}
	}
	for _, i := range served {
		if stock := inventoryStock(t, base, sku(i)); stock != 9 {
			t.Errorf("served order %d: %s has stock %d, want 9", i, sku(i), stock)
		}
	}
	// A refused key was never recorded: sent again, it is a new order.
	if code, body := post(t, base, sku(refused[0]), 1, "cap-key-"+strconv.Itoa(refused[0])); code != http.StatusCreated {
		t.Errorf("a refused order sent again: %d %s, want 201", code, body)
	}
	if m := metrics(t, base); !strings.Contains(m, `oversold_http_refused_total{replica="cap"} `+strconv.Itoa(clients-limit)) {
		t.Errorf("metrics do not count %d refused requests", clients-limit)
	}
}

// inventoryStock is sku's stock as GET /v1/inventory/{sku} tells it.
func inventoryStock(t *testing.T, base, sku string) int64 {
	t.Helper()
	res, err := testClient.Get(base + "/v1/inventory/" + sku)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var item struct{ Stock int64 }
	if err := json.NewDecoder(res.Body).Decode(&item); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET inventory %s: %d %v", sku, res.StatusCode, err)
	}
	return item.Stock
}
