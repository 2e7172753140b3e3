package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
)

// TestFaultHookBuildTag: the default build of orderd has no fault hook (a
// set OVERSOLD_FAULT_HOOK stops it, --fault-hook is no flag, --help does
// not list it); the labfaults build calls the hook inside the order flow.
func TestFaultHookBuildTag(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		calls []string
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.URL.Query().Get("at")+" "+r.URL.Query().Get("sku"))
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	mysqlDSN, redisAddr := testbed.MySQL(t), testbed.Redis(t)
	vars := []string{"OVERSOLD_ADDR=127.0.0.1:0", "OVERSOLD_MYSQL_DSN=" + mysqlDSN, "OVERSOLD_REDIS_ADDR=" + redisAddr,
		"OVERSOLD_LOCK=local", "OVERSOLD_ADMIN_TOKEN=hook-token", "OVERSOLD_FAULT_HOOK=" + hook.URL + "/hook"}

	t.Run("default build refuses it", func(t *testing.T) {
		t.Parallel()
		bin := orderdBinary(t)
		exitsWithOneLine(t, command(bin, append(vars, "OVERSOLD_INSTANCE=nohook")...),
			"orderd: OVERSOLD_FAULT_HOOK: this orderd is built without the lab's fault hook (go build -tags labfaults)\n")
		flagged := command(bin)
		flagged.Args = append(flagged.Args, "--fault-hook", hook.URL)
		exitsWithOneLine(t, flagged, "orderd: flags: flag provided but not defined: -fault-hook\n")
		if help := helpText(t, bin); strings.Contains(help, "FAULT_HOOK") {
			t.Errorf("--help lists the fault hook:\n%s", help)
		}
	})
	t.Run("labfaults build calls it", func(t *testing.T) {
		t.Parallel()
		bin := orderdBinary(t, "-tags", "labfaults")
		if help := helpText(t, bin); !strings.Contains(help, "--fault-hook") {
			t.Errorf("--help does not list --fault-hook:\n%s", help)
		}
		base := startOrderd(t, command(bin, append(vars, "OVERSOLD_INSTANCE=hook")...))
		put(t, base, "hook-token", "hooked", 5)
		if code, body := post(t, base, "hooked", 1, ""); code != http.StatusCreated {
			t.Fatalf("POST = %d %s", code, body)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(calls) == 0 || !strings.HasSuffix(calls[0], " hooked") {
			t.Errorf("hook calls %q, want the order's", calls)
		}
		// Only the fault points reach the lab, never the flow's other
		// steps (lock granted, write settled, release).
		want := "[after-read hooked before-write hooked before-commit hooked before-cache hooked after-commit hooked]"
		if fmt.Sprint(calls) != want {
			t.Errorf("hook calls %q, want %s", calls, want)
		}
	})
}

// testClient bounds every request of these tests: a hung replica fails
// the test instead of stalling it.
var testClient = &http.Client{Timeout: 30 * time.Second}

// helpText is what bin --help prints.
func helpText(t *testing.T, bin string) string {
	t.Helper()
	cmd := command(bin)
	cmd.Args = append(cmd.Args, "--help")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v\n%s", err, out)
	}
	return string(out)
}

// startOrderd starts cmd (an orderd listening on port 0), waits until it
// answers /readyz and returns its base URL. The process is killed at cleanup.
func startOrderd(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// The JSON log's first line says where it listens (port 0 picked one).
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "orderd listening" {
				addr <- line.Addr
			}
		}
		close(addr)
		io.Copy(io.Discard, stderr)
	}()
	a, ok := <-addr
	if !ok {
		t.Fatal("orderd exited before listening")
	}
	base := "http://" + a
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		res, err := testClient.Get(base + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("orderd at %s never ready: %v", base, err)
		}
	}
}

// put sets sku's stock through the admin route.
func put(t *testing.T, base, token, sku string, stock int) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, base+"/v1/inventory/"+sku, strings.NewReader(`{"stock":`+strconv.Itoa(stock)+`}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("PUT %s = %d %s", sku, res.StatusCode, b)
	}
}

// post places an order and returns the answer's status and body.
func post(t *testing.T, base, sku string, quantity int, key string) (int, string) {
	t.Helper()
	code, _, body := postOrder(base, sku, quantity, key)
	return code, body
}

// postOrder places an order; status 0 and the error as body when the
// request failed.
func postOrder(base, sku string, quantity int, key string) (int, http.Header, string) {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/orders", strings.NewReader(`{"sku":"`+sku+`","quantity":`+strconv.Itoa(quantity)+`}`))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := testClient.Do(req)
	if err != nil {
		return 0, nil, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(b)
}
