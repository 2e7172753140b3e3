package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
)

func TestMain(m *testing.M) { testbed.Main(m) }

const (
	// readyWithin bounds the wait for /readyz: orderd's own start timeout
	// (45s, a migration waiting for another replica's) plus a margin.
	readyWithin = 60 * time.Second
	// stopWithin bounds the graceful shutdown after SIGTERM of an orderd
	// with nothing in flight, which stops at once (its deadline, for
	// orders in flight, is longer).
	stopWithin = 20 * time.Second
	// composeReplica is the replica whose environment the test runs: the
	// wiring test already proves every replica has the same one.
	composeReplica = "orderd1"
)

// designBackends are the lock backends of docs/design.md (its OVERSOLD_LOCK
// values but none): each must be in locking/backends and start orderd with
// the compose environment.
var designBackends = slices.DeleteFunc(slices.Clone(designLocks), func(name string) bool { return name == "none" })

// kept are the settings of the compose environment the test must pass to
// orderd exactly as compose gives them; a server address or the listen
// address is all it may change.
var kept = []string{
	"OVERSOLD_INSTANCE",
	"OVERSOLD_LOCK",
	"OVERSOLD_GUARD",
	"OVERSOLD_LOCK_TTL",
	"OVERSOLD_LOCK_WAIT",
	"OVERSOLD_WORK_DELAY",
	"OVERSOLD_ADMIN_TOKEN",
}

// testServers are the testbed's servers, standing in for the stack's.
type testServers struct {
	redis   string
	redlock []string
	zk      []string
	etcd    []string
}

// TestComposeEnvStartsOrderd runs the real orderd binary with the compose
// stack's orderd environment (from docker-compose.yml and .env, as `docker
// compose` reads them), its server addresses swapped for the testbed's real
// servers: it must get ready, take an order and stop on SIGTERM. Once with
// the lock of .env, then once per lock backend, OVERSOLD_LOCK overridden.
func TestComposeEnvStartsOrderd(t *testing.T) {
	p, err := loadCompose(t, absRepoRoot(t))
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	svc, ok := p.Services[composeReplica]
	if !ok {
		t.Fatalf("docker-compose.yml has no %s", composeReplica)
	}
	compose := environment(svc)
	for _, key := range append(slices.Clone(kept), append(serverVars, "OVERSOLD_ADDR")...) {
		if compose[key] == "" {
			t.Fatalf("%s: %s is not set; the test needs every setting compose gives orderd", composeReplica, key)
		}
	}

	srv := testServers{
		redis:   testbed.Redis(t),
		redlock: testbed.Redises(t, len(strings.Split(compose["OVERSOLD_REDLOCK_ADDRS"], ","))),
		zk:      testbed.ZooKeeper(t),
		etcd:    testbed.Etcd(t),
	}
	bin := filepath.Join(t.TempDir(), "orderd")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./cmd/orderd")
	build.Dir = absRepoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/orderd: %v\n%s", err, out)
	}

	t.Run("lock of .env: "+compose["OVERSOLD_LOCK"], func(t *testing.T) {
		t.Parallel()
		if err := runOrderd(t, bin, composeEnv(t, compose, srv)); err != nil {
			t.Fatal(err)
		}
	})
	for _, name := range append([]string{"none"}, designBackends...) {
		t.Run("lock "+name, func(t *testing.T) {
			if name != "none" && !slices.Contains(backends.Names, name) {
				t.Skipf("locking/backends.Names %v has no %q yet: nothing to start", backends.Names, name)
			}
			t.Parallel()
			env := composeEnv(t, compose, srv)
			env["OVERSOLD_LOCK"] = name
			if err := runOrderd(t, bin, env); err != nil {
				t.Fatal(err)
			}
		})
	}
	// The check can fail: a setting orderd refuses stops it at once, and
	// the test reports the variable.
	t.Run("refuses a setting orderd refuses", func(t *testing.T) {
		t.Parallel()
		env := composeEnv(t, compose, srv)
		env["OVERSOLD_LOCK_WAIT"] = "5 seconds"
		err := runOrderd(t, bin, env)
		if err == nil || !strings.Contains(err.Error(), "exit status 2") || !strings.Contains(err.Error(), "OVERSOLD_LOCK_WAIT") {
			t.Fatalf("orderd with OVERSOLD_LOCK_WAIT=%q: %v; want exit status 2 naming the variable", env["OVERSOLD_LOCK_WAIT"], err)
		}
	})
	t.Run("every backend of locking/backends is tried", func(t *testing.T) {
		for _, name := range backends.Names {
			if !slices.Contains(designBackends, name) {
				t.Errorf("locking/backends.Names has %q, which this test does not start orderd with", name)
			}
		}
	})
}

// composeEnv is compose's environment with every server address swapped
// for the testbed's (a fresh database per call) and a free loopback listen
// address; everything else as compose gives it.
func composeEnv(t *testing.T, compose map[string]string, srv testServers) map[string]string {
	t.Helper()
	env := maps.Clone(compose)

	// The DSN keeps compose's parameters (parseTime, ...); the server,
	// user, password and database are the testbed's.
	cfg, err := mysql.ParseDSN(compose["OVERSOLD_MYSQL_DSN"])
	if err != nil {
		t.Fatalf("compose OVERSOLD_MYSQL_DSN: %v", err)
	}
	tb, err := mysql.ParseDSN(testbed.MySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net, cfg.Addr, cfg.User, cfg.Passwd, cfg.DBName = tb.Net, tb.Addr, tb.User, tb.Passwd, tb.DBName
	env["OVERSOLD_MYSQL_DSN"] = cfg.FormatDSN()

	env["OVERSOLD_REDIS_ADDR"] = srv.redis
	env["OVERSOLD_REDLOCK_ADDRS"] = strings.Join(srv.redlock, ",")
	env["OVERSOLD_ZK_SERVERS"] = strings.Join(srv.zk, ",")
	// The endpoints keep compose's scheme (http://).
	scheme := ""
	if s, _, ok := strings.Cut(compose["OVERSOLD_ETCD_ENDPOINTS"], "://"); ok {
		scheme = s + "://"
	}
	var eps []string
	for _, ep := range srv.etcd {
		if !strings.Contains(ep, "://") {
			ep = scheme + ep
		}
		eps = append(eps, ep)
	}
	env["OVERSOLD_ETCD_ENDPOINTS"] = strings.Join(eps, ",")
	env["OVERSOLD_ADDR"] = "127.0.0.1:" + strconv.Itoa(freePort(t))

	// Only the addresses changed, and each of them did.
	for _, key := range union(env, compose) {
		changed := env[key] != compose[key]
		swapped := slices.Contains(serverVars, key) || key == "OVERSOLD_ADDR"
		if changed != swapped {
			t.Fatalf("%s: compose %q, test %q: only server and listen addresses may differ, and all of them must", key, compose[key], env[key])
		}
	}
	return env
}

// runOrderd starts bin with exactly env, waits for /readyz, places one
// order through the API and stops orderd with SIGTERM. It returns the first
// problem, with orderd's output.
func runOrderd(t *testing.T, bin string, env map[string]string) (err error) {
	var environ []string
	for _, k := range union(env, nil) {
		environ = append(environ, k+"="+env[k])
	}
	var logs syncBuffer
	cmd := exec.Command(bin)
	cmd.Env = environ // nothing of the test's own environment
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
	})
	defer func() {
		if err != nil {
			err = fmt.Errorf("lock=%s: %w\norderd output:\n%s", env["OVERSOLD_LOCK"], err, logs.String())
		}
	}()

	base := "http://" + env["OVERSOLD_ADDR"]
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()

	// Ready, bounded; an orderd that exits is reported at once.
	start := time.Now()
	for {
		status, body, err := do(client, "GET", base+"/readyz", "", nil)
		if err == nil && status == http.StatusOK {
			break
		}
		select {
		case <-exited:
			return fmt.Errorf("orderd exited before ready: %v (last /readyz: %d %s %v)", waitErr, status, body, err)
		default:
		}
		if time.Since(start) > readyWithin {
			return fmt.Errorf("not ready within %v: last /readyz %d %s %v", readyWithin, status, body, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("lock=%s guard=%s ready in %v", env["OVERSOLD_LOCK"], env["OVERSOLD_GUARD"], time.Since(start).Round(time.Millisecond))

	// One order through the API, with compose's admin token for the stock.
	sku := "compose-" + env["OVERSOLD_LOCK"]
	status, body, err := do(client, "PUT", base+"/v1/inventory/"+sku, `{"stock": 10}`,
		map[string]string{"Authorization": "Bearer " + env["OVERSOLD_ADMIN_TOKEN"]})
	if err != nil || status != http.StatusOK {
		return fmt.Errorf("PUT /v1/inventory/%s with the compose admin token = %d %s %v, want 200", sku, status, body, err)
	}
	status, body, err = do(client, "POST", base+"/v1/orders", `{"sku": "`+sku+`", "quantity": 1}`,
		map[string]string{"Idempotency-Key": "compose-env-" + sku})
	if err != nil || status != http.StatusCreated {
		return fmt.Errorf("POST /v1/orders = %d %s %v, want 201", status, body, err)
	}
	var o struct {
		Instance, Lock string
		Quantity       int64
	}
	if err := json.Unmarshal([]byte(body), &o); err != nil || o.Instance != env["OVERSOLD_INSTANCE"] || o.Lock != env["OVERSOLD_LOCK"] || o.Quantity != 1 {
		return fmt.Errorf("order %s (%v): want instance %s, lock %s, quantity 1", body, err, env["OVERSOLD_INSTANCE"], env["OVERSOLD_LOCK"])
	}
	if status, _, err := do(client, "GET", base+"/openapi.json", "", nil); err != nil || status != http.StatusOK {
		return fmt.Errorf("GET /openapi.json = %d %v, want 200", status, err)
	}
	client.CloseIdleConnections()

	// SIGTERM: a clean shutdown, exit status 0.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-exited:
		if waitErr != nil {
			return fmt.Errorf("orderd after SIGTERM: %w, want exit status 0", waitErr)
		}
	case <-time.After(stopWithin):
		return fmt.Errorf("orderd still running %v after SIGTERM", stopWithin)
	}
	if !strings.Contains(logs.String(), `"msg":"stopped"`) {
		return errors.New("orderd exited 0 after SIGTERM without logging its graceful stop")
	}
	return nil
}

// do sends one request and returns the status and body.
func do(client *http.Client, method, url, body string, header map[string]string) (int, string, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), err
}

// syncBuffer collects a child's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
