package faults_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
	"github.com/oversold-lab/oversold/loadtest/faults"
)

// The scenarios' tests share this file's TestMain and helpers: orderd is
// built once per test binary, and each test runs short lab runs (small
// stock, one repetition) on real servers from internal/testbed.

func TestMain(m *testing.M) {
	code := func() int {
		defer removeOrderd()
		return testbedMain(m)
	}()
	os.Exit(code)
}

// testbedMain is testbed.Main without its os.Exit, so the binary is removed.
func testbedMain(m *testing.M) int {
	defer testbed.StopShared()
	return m.Run()
}

var (
	orderdOnce sync.Once
	orderdBin  string
	orderdErr  error
	orderdDir  string
)

// orderd builds cmd/orderd once for the whole test binary, with the lab's
// fault hook (build tag labfaults), as the lab does.
func orderd(t *testing.T) string {
	t.Helper()
	orderdOnce.Do(func() {
		orderdDir, orderdErr = os.MkdirTemp("", "oversold-faults-")
		if orderdErr != nil {
			return
		}
		orderdBin = filepath.Join(orderdDir, "orderd")
		out, err := exec.Command("go", "build", "-tags", "labfaults", "-o", orderdBin, "github.com/oversold-lab/oversold/cmd/orderd").CombinedOutput()
		if err != nil {
			orderdErr = fmt.Errorf("build orderd: %w: %s", err, out)
		}
	})
	if orderdErr != nil {
		t.Fatal(orderdErr)
	}
	return orderdBin
}

func removeOrderd() {
	if orderdDir != "" {
		os.RemoveAll(orderdDir)
	}
}

// needServers skips the test when MariaDB or Redis is not installed, or
// fails it under OVERSOLD_REQUIRE_SERVERS=1 (make test, CI).
func needServers(t *testing.T, kinds ...string) {
	t.Helper()
	for _, kind := range append([]string{testbed.KindMariaDB, testbed.KindRedis}, kinds...) {
		if cmd := testbed.Missing(kind); cmd != "" {
			if os.Getenv(testbed.EnvRequireServers) == "1" {
				t.Fatalf("%s is not installed: %s", kind, cmd)
			}
			t.Skipf("%s is not installed: %s", kind, cmd)
		}
	}
}

// serverKind is the testbed kind a lock backend needs beyond MariaDB and Redis.
var serverKind = map[string]string{"zookeeper": testbed.KindZooKeeper, "etcd": testbed.KindEtcd}

// lab is a Runner on real servers for one test: its own database, its own
// Redis, and the servers backend needs.
func lab(t *testing.T, backend string) *loadtest.Runner {
	t.Helper()
	if k := serverKind[backend]; k != "" {
		needServers(t, k)
	} else {
		needServers(t)
	}
	bin := orderd(t)
	srv := loadtest.Servers{MySQLDSN: testbed.MySQL(t), RedisAddr: testbed.Redis(t)}
	switch backend {
	case "redlock":
		srv.RedlockAddrs = testbed.Redises(t, 3)
	case "zookeeper":
		srv.ZKServers = testbed.ZooKeeper(t)
	case "etcd":
		srv.EtcdEndpoints = testbed.Etcd(t)
	}
	db, err := sql.Open("mysql", srv.MySQLDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &loadtest.Runner{
		Binary:     bin,
		Servers:    srv,
		AdminToken: "faults-test",
		DB:         db,
		Out:        t.TempDir(),
		Faults:     faults.All(),
		ID:         strings.ReplaceAll(testbed.Prefix(t), "_", "-"),
	}
}

// short is a small run of fault on backend with guard: one repetition,
// small stock, the lab's defaults otherwise, a 1 s lease.
func short(fault, backend, guard string) loadtest.Spec {
	return loadtest.Spec{
		Backend: backend, Guard: guard, Fault: fault, Replicas: 3,
		Stock: 20, SKUs: 1, Requests: 60, Rate: 200, Workers: 16,
		WorkDelay: 2 * time.Millisecond, LockTTL: time.Second, Seed: 1,
	}
}

// runFault runs spec on a lab of its own and logs what happened.
func runFault(t *testing.T, spec loadtest.Spec) loadtest.Result {
	t.Helper()
	return runFaultWithin(t, spec, 2*time.Minute)
}

// runFaultWithin is runFault bounded by limit.
func runFaultWithin(t *testing.T, spec loadtest.Spec, limit time.Duration) loadtest.Result {
	t.Helper()
	rn := lab(t, spec.Backend)
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	t0 := time.Now()
	res := rn.Run(ctx, spec, nil)
	t.Logf("%s in %s (phases %+v): %s", res.Name(), time.Since(t0).Round(100*time.Millisecond), res.Phases, res.Story())
	for _, n := range res.Notes {
		t.Logf("  note: %s", n)
	}
	if res.Error != "" {
		t.Fatalf("%s could not run: %s", res.Name(), res.Error)
	}
	return res
}
