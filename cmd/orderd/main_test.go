package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestUnreachableServers: a server that does not answer at start is a bad
// setting: one line naming its variable, exit status 2, no password shown.
func TestUnreachableServers(t *testing.T) {
	t.Parallel()
	dead := closedAddr(t)
	mysqlDSN := testbed.MySQL(t)
	for _, c := range []struct {
		name string
		env  func(string) string
		want string
	}{
		{"mysql", env("OVERSOLD_MYSQL_DSN", "app:hunter2@tcp("+dead+")/oversold", "OVERSOLD_LOCK", "local"),
			"OVERSOLD_MYSQL_DSN: connect to app:***@tcp(" + dead + ")/oversold"},
		{"redis", env("OVERSOLD_MYSQL_DSN", mysqlDSN, "OVERSOLD_REDIS_ADDR", dead, "OVERSOLD_LOCK", "local"),
			"OVERSOLD_REDIS_ADDR: ping " + dead + ": "},
		{"listen address", env("OVERSOLD_MYSQL_DSN", mysqlDSN, "OVERSOLD_REDIS_ADDR", testbed.Redis(t), "OVERSOLD_LOCK", "none",
			"OVERSOLD_ADDR", "192.0.2.1:1", "OVERSOLD_INSTANCE", "unreach"),
			"OVERSOLD_ADDR: listen tcp 192.0.2.1:1: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := run(t.Context(), nil, c.env, &stderr)
			if err == nil || !strings.HasPrefix(err.Error(), c.want) || exitCode(err) != 2 {
				t.Errorf("run = %v (exit %d), want %q... and exit 2", err, exitCode(err), c.want)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("the password leaked: %v", err)
			}
		})
	}
}

// A stock gate on a Redis that may evict keys would lose a counter or the
// keys it remembers under memory pressure: orderd refuses to start,
// naming the setting and the fix. Without the gate, the cache alone may
// be evicted.
func TestGateRefusesEvictingRedis(t *testing.T) {
	t.Parallel()
	if cmd := testbed.Missing(testbed.KindRedis); cmd != "" {
		t.Skip(cmd)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	evicting, err := testbed.StartRedis(ctx, testbed.Options{Args: []string{"--maxmemory-policy", "allkeys-lru"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { evicting.Stop() })
	vars := env("OVERSOLD_MYSQL_DSN", testbed.MySQL(t), "OVERSOLD_REDIS_ADDR", evicting.Addr, "OVERSOLD_LOCK", "none",
		"OVERSOLD_GUARD", "atomic", "OVERSOLD_GATE", "redis", "OVERSOLD_ADDR", "127.0.0.1:0", "OVERSOLD_INSTANCE", "evict")
	err = run(ctx, nil, vars, io.Discard)
	want := "OVERSOLD_REDIS_ADDR: stock gate: redis has maxmemory-policy allkeys-lru"
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "noeviction") || exitCode(err) != 2 {
		t.Errorf("run = %v (exit %d), want %q... naming noeviction, and exit 2", err, exitCode(err), want)
	}
}

// orderdBinary builds the real binary into the test's temp dir, with
// the go build flags given (such as -tags labfaults).
func orderdBinary(t *testing.T, flags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "orderd")
	args := append(append([]string{"build"}, flags...), "-o", bin, ".")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// command runs the binary with only the given variables (and PATH, HOME).
func command(bin string, vars ...string) *exec.Cmd {
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, vars...)
	return cmd
}

// TestBinary builds the real orderd once and runs it.
func TestBinary(t *testing.T) {
	t.Parallel()
	bin := orderdBinary(t)
	t.Run("bad setting", func(t *testing.T) {
		t.Parallel()
		exitsWithOneLine(t, command(bin, "OVERSOLD_LOCK_TTL=abc"), "orderd: OVERSOLD_LOCK_TTL: time: invalid duration \"abc\"\n")
	})
	t.Run("fencing without tokens", func(t *testing.T) {
		t.Parallel()
		exitsWithOneLine(t, command(bin, "OVERSOLD_GUARD=fencing", "OVERSOLD_LOCK=redlock", "OVERSOLD_REDLOCK_ADDRS=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"),
			"orderd: OVERSOLD_GUARD: fencing needs fencing tokens, and OVERSOLD_LOCK=redlock has none (want a lock of redis, zookeeper, mysql, etcd, or another guard)\n")
	})
	t.Run("unreachable redis", func(t *testing.T) {
		t.Parallel()
		dead := closedAddr(t)
		exitsWithOneLine(t, command(bin, "OVERSOLD_MYSQL_DSN="+testbed.MySQL(t), "OVERSOLD_REDIS_ADDR="+dead, "OVERSOLD_LOCK=local"),
			"orderd: OVERSOLD_REDIS_ADDR: ping "+dead+": dial tcp "+dead+": connect: connection refused\n")
	})
	t.Run("serves and drains", func(t *testing.T) {
		t.Parallel()
		servesAndDrains(t, bin)
	})
	t.Run("bad gate", func(t *testing.T) {
		t.Parallel()
		exitsWithOneLine(t, command(bin, "OVERSOLD_GATE=lua"), "orderd: OVERSOLD_GATE: unknown gate \"lua\" (want none, redis)\n")
	})
	t.Run("gate", func(t *testing.T) {
		t.Parallel()
		gateRefuses(t, bin)
	})
	t.Run("queue", func(t *testing.T) {
		t.Parallel()
		queueConfirms(t, bin)
	})
	t.Run("queue without gate", func(t *testing.T) {
		t.Parallel()
		exitsWithOneLine(t, command(bin, "OVERSOLD_ACCEPT=queue"),
			"orderd: OVERSOLD_ACCEPT: queue takes the stock at the gate, and OVERSOLD_GATE=none (want OVERSOLD_GATE=redis, or accept sync)\n")
	})
	t.Run("answers a long batch through shutdown", func(t *testing.T) {
		t.Parallel()
		answersLongBatch(t, bin)
	})
}

// gateRefuses runs the real orderd with the stock gate: a SKU of stock 2
// sells 2 and the gate refuses the rest (409 out_of_stock), counted as
// short by oversold_gate_total; a replay is 200 and takes nothing.
func gateRefuses(t *testing.T, bin string) {
	const token = "e2e-gate"
	base := startOrderd(t, command(bin, "OVERSOLD_ADDR=127.0.0.1:0", "OVERSOLD_INSTANCE=e2e-gate",
		"OVERSOLD_MYSQL_DSN="+testbed.MySQL(t), "OVERSOLD_REDIS_ADDR="+testbed.Redis(t),
		"OVERSOLD_LOCK=none", "OVERSOLD_GUARD=atomic", "OVERSOLD_GATE=redis", "OVERSOLD_ADMIN_TOKEN="+token))
	put(t, base, token, "gated", 2)
	for i, want := range []int{201, 201, 409} {
		code, _, body := postOrder(base, "gated", 1, fmt.Sprint("k", i))
		if code != want || (want == 409 && !strings.Contains(body, `"out_of_stock"`)) {
			t.Fatalf("order %d = %d %s, want %d", i, code, body, want)
		}
	}
	if code, _, body := postOrder(base, "gated", 1, "k0"); code != 200 {
		t.Fatalf("replay = %d %s, want 200", code, body)
	}
	got := map[string]string{}
	for _, line := range strings.Split(metrics(t, base), "\n") {
		if rest, ok := strings.CutPrefix(line, `oversold_gate_total{outcome="`); ok {
			outcome, _, _ := strings.Cut(rest, `"`)
			got[outcome] = line[strings.LastIndex(line, " ")+1:]
		}
	}
	if got["short"] != "1" || got["taken"] != "2" || got["done"] != "2" {
		t.Errorf("oversold_gate_total by outcome %v, want short 1, taken 2, done 2", got)
	}
}

// queueConfirms runs the real orderd with accept queue: orders are 202
// pending, the gate refuses past the stock, each accepted order is then
// confirmed (GET, and a replay of its key), MySQL's stock is what they
// took; a replica of the same database with accept sync is refused.
func queueConfirms(t *testing.T, bin string) {
	const token = "e2e-queue"
	mysqlDSN, redisAddr := testbed.MySQL(t), testbed.Redis(t)
	vars := func(instance, accept string) []string {
		return []string{"OVERSOLD_ADDR=127.0.0.1:0", "OVERSOLD_INSTANCE=" + instance,
			"OVERSOLD_MYSQL_DSN=" + mysqlDSN, "OVERSOLD_REDIS_ADDR=" + redisAddr,
			"OVERSOLD_LOCK=redis", "OVERSOLD_GUARD=version", "OVERSOLD_GATE=redis", "OVERSOLD_ACCEPT=" + accept,
			"OVERSOLD_ADMIN_TOKEN=" + token}
	}
	base := startOrderd(t, command(bin, vars("e2e-queue", "queue")...))
	put(t, base, token, "queued", 2)
	var ids []string
	for i, want := range []int{202, 202, 409} {
		code, _, body := postOrder(base, "queued", 1, fmt.Sprint("q", i))
		if code != want || (want == 409 && !strings.Contains(body, `"out_of_stock"`)) {
			t.Fatalf("order %d = %d %s, want %d", i, code, body, want)
		}
		var o struct{ ID, Status string }
		if want == 202 {
			if err := json.Unmarshal([]byte(body), &o); err != nil || o.Status != "pending" {
				t.Fatalf("order %d = %s, want status pending (%v)", i, body, err)
			}
			ids = append(ids, o.ID)
		}
	}
	for _, id := range ids {
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			res, err := testClient.Get(base + "/v1/orders/" + id)
			if err != nil {
				t.Fatal(err)
			}
			var o struct{ Status string }
			err = json.NewDecoder(res.Body).Decode(&o)
			res.Body.Close()
			if err != nil || res.StatusCode != 200 {
				t.Fatalf("GET %s = %d %v", id, res.StatusCode, err)
			}
			if o.Status == "confirmed" {
				break
			}
			if o.Status != "pending" || time.Now().After(deadline) {
				t.Fatalf("order %s is %s, want confirmed", id, o.Status)
			}
		}
	}
	if code, _, body := postOrder(base, "queued", 1, "q0"); code != 200 || !strings.Contains(body, `"confirmed"`) {
		t.Fatalf("replay = %d %s, want 200 confirmed", code, body)
	}
	res, err := testClient.Get(base + "/v1/inventory/queued")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(b), `"stock":0`) {
		t.Errorf("inventory %s, want stock 0", b)
	}
	var stderr bytes.Buffer
	sync := command(bin, vars("e2e-sync", "sync")...)
	sync.Stderr = &stderr
	err = sync.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || strings.Count(stderr.String(), "\n") != 1 ||
		!strings.Contains(stderr.String(), "live replica e2e-queue runs lock=redis guard=version gate=redis+keys accept=queue, this one lock=redis guard=version gate=redis+keys accept=sync") {
		t.Errorf("a sync replica beside a queue one: %v, stderr %q; want exit 2 naming both", err, stderr.String())
	}
}

// exitsWithOneLine runs cmd and wants exit status 2 and exactly want on stderr.
func exitsWithOneLine(t *testing.T, cmd *exec.Cmd, want string) {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("exit: %v, want status 2", err)
	}
	if got := stderr.String(); got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
}

// servesAndDrains starts the real orderd against private servers
// with lock local, waits for /readyz, places an order, then sends SIGTERM
// while a slow order is inside its critical section, and sees that order
// answered 201 and orderd exit 0.
func servesAndDrains(t *testing.T, bin string) {
	const token = "e2e-token"
	cmd := command(bin,
		"OVERSOLD_ADDR=127.0.0.1:0",
		"OVERSOLD_INSTANCE=e2e",
		"OVERSOLD_MYSQL_DSN="+testbed.MySQL(t),
		"OVERSOLD_REDIS_ADDR="+testbed.Redis(t),
		"OVERSOLD_LOCK=local",
		"OVERSOLD_WORK_DELAY=1500ms",
		"OVERSOLD_ADMIN_TOKEN="+token,
	)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	// The JSON log's first line says where it listens (port 0 picked one).
	logs := make(chan map[string]any, 100)
	go func() {
		defer close(logs)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				t.Errorf("log line is not JSON: %q", sc.Text())
				continue
			}
			logs <- line
		}
	}()
	var base string
	for line := range logs {
		if line["msg"] == "orderd listening" {
			base = "http://" + line["addr"].(string)
			if line["instance"] != "e2e" || line["lock"] != "local" || line["guard"] != "version" {
				t.Errorf("start line %v", line)
			}
			break
		}
	}
	if base == "" {
		t.Fatal("orderd exited before listening")
	}

	client := &http.Client{Timeout: 30 * time.Second}
	do := func(method, path, body string, header ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		res, err := client.Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", method, path, err)
			return 0, ""
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := do("GET", "/readyz", "")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready: %d %s", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body := do("PUT", "/v1/inventory/widget", `{"stock":3}`, "Authorization", "Bearer "+token); code != 200 {
		t.Fatalf("PUT = %d %s", code, body)
	}
	if code, body := do("POST", "/v1/orders", `{"sku":"widget","quantity":1}`); code != 201 {
		t.Fatalf("POST = %d %s", code, body)
	}

	// The slow order: once it holds the lock (one grant more than so far:
	// the PUT and the first order take it too), it is in its critical
	// section, 1.5s of work from its commit.
	grants := lockGrants(t, base)
	slow := make(chan int, 1)
	go func() {
		code, _ := do("POST", "/v1/orders", `{"sku":"widget","quantity":2}`, "Idempotency-Key", "slow")
		slow <- code
	}()
	for lockGrants(t, base) == grants {
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := <-slow; code != 201 {
		t.Errorf("the in-flight order answered %d, want 201", code)
	}
	var messages []string
	for line := range logs {
		messages = append(messages, fmt.Sprint(line["msg"]))
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("orderd exited with %v, want status 0", err)
	}
	if !strings.Contains(strings.Join(messages, "|"), "shutting down: finishing in-flight orders|") ||
		messages[len(messages)-1] != "stopped" {
		t.Errorf("log messages after SIGTERM: %q", messages)
	}
	if _, err := (&net.Dialer{Timeout: time.Second}).DialContext(context.Background(), "tcp", strings.TrimPrefix(base, "http://")); err == nil {
		t.Errorf("still accepting connections after exit")
	}
}

// answersLongBatch: with 1s of work per order, 24 orders sent at once are
// answered in about 24s, past the request timeout (5s) and 15s more: the
// batches that took them run that long. orderd gets SIGTERM once every
// order is taken. Each order must still get its answer, 201, and orderd
// exit 0: neither the server's write timeout nor its shutdown deadline
// may cut a batch short of its answers (a client without a key would buy
// again).
func answersLongBatch(t *testing.T, bin string) {
	const token, n = "e2e-token", 24
	cmd := command(bin,
		"OVERSOLD_ADDR=127.0.0.1:0",
		"OVERSOLD_INSTANCE=e2e-batch",
		"OVERSOLD_MYSQL_DSN="+testbed.MySQL(t),
		"OVERSOLD_REDIS_ADDR="+testbed.Redis(t),
		"OVERSOLD_LOCK=local",
		"OVERSOLD_WORK_DELAY=1s",
		"OVERSOLD_LOCK_WAIT=4s",
		"OVERSOLD_REQUEST_TIMEOUT=5s",
		"OVERSOLD_ADMIN_TOKEN="+token,
	)
	base := startOrderd(t, cmd)
	put(t, base, token, "long", 100)
	client := &http.Client{Timeout: 3 * time.Minute} // longer than the batches
	order := func(key string) (int, error) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/orders", strings.NewReader(`{"sku":"long","quantity":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		res, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		_, err = io.ReadAll(res.Body)
		return res.StatusCode, err
	}

	begin := time.Now()
	codes := make([]int, n)
	errs := make([]error, n)
	ready := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-ready
			codes[i], errs[i] = order(fmt.Sprintf("long-%02d", i))
		})
	}
	close(ready)
	for deadline := time.Now().Add(30 * time.Second); batched(t, base) < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %v of %d orders taken by a batch after 30s", batched(t, base), n)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("answered within %v", time.Since(begin).Round(time.Second))
	for i := range n {
		if errs[i] != nil || codes[i] != http.StatusCreated {
			t.Errorf("order %d: %d %v, want 201", i, codes[i], errs[i])
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("orderd exited with %v, want status 0", err)
	}
}

// batched is how many orders the replica's batches have taken.
func batched(t *testing.T, base string) float64 {
	t.Helper()
	for line := range strings.Lines(metrics(t, base)) {
		if strings.HasPrefix(line, "oversold_batch_orders_sum{") {
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			return v
		}
	}
	return 0
}

// lockGrants is the replica's count of lock waits that ended.
func lockGrants(t *testing.T, base string) string {
	t.Helper()
	const series = `oversold_lock_wait_seconds_count{lock="local",replica="e2e"} `
	m := metrics(t, base)
	i := strings.Index(m, series)
	if i < 0 {
		t.Fatalf("no %s in the metrics", series)
	}
	n, _, _ := strings.Cut(m[i+len(series):], "\n")
	return n
}

func metrics(t *testing.T, base string) string {
	t.Helper()
	res, err := testClient.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}
