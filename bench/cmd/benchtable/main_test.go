package main

import (
	"math"
	"strings"
	"testing"
)

// input is crafted benchmark output: config lines, a result line split by a
// stray log line, a repeated result (-count 2), a server where ours skipped,
// and lines that are none of ours.
const input = `oversold-cpu: Test CPU 9000
oversold-cores: 2
oversold-kernel: linux 6.1
oversold-go: go1.26.8
oversold-date: 2026-01-02 03:04 UTC
oversold-benchtime: 3s
oversold-server: redis Redis 7.0.15
oversold-impl: redis ours pub/sub wake-up
oversold-impl: redis slowpeer retries every 100ms
goos: linux
cpu: Fallback CPU
BenchmarkRedis/uncontended/ours-2     	    1000	    200000 ns/op	      5000 acq/s	  0.30 wait-p99-ms
BenchmarkRedis/uncontended/slowpeer-2 	    1000	    180000 ns/op	      5500 acq/s	  0.25 wait-p99-ms
BenchmarkRedis/uncontended/fastpeer-2 	    1000	    150000 ns/op	      4000 acq/s	  0.20 wait-p99-ms
BenchmarkRedis/hot-8/ours-2           	     900	   1000000 ns/op	      1000 acq/s	  0.50 handoff-p50-ms	  2.0 handoff-p99-ms	  6 wait-p99-ms
BenchmarkRedis/hot-8/ours-2           	     900	   1000000 ns/op	      3000 acq/s	  0.30 handoff-p50-ms	  4.0 handoff-p99-ms	  8 wait-p99-ms
BenchmarkRedis/hot-8/slowpeer-2       	{"level":"warn","msg":"a log line split this result"}
      50	  70000000 ns/op	        20 acq/s	     100 handoff-p50-ms	  105 handoff-p99-ms	  600 wait-p99-ms	  92.4 retake-%
BenchmarkRedis/hot-8/fastpeer-2       	     300	   3000000 ns/op	       400 acq/s	     1.6 handoff-p50-ms	  1.5 handoff-p99-ms	  300 wait-p99-ms
oversold-server: mysql MariaDB 10.11.19
BenchmarkMySQL/hot-8/get-lock-2       	    2000	    900000 ns/op	      1100 acq/s	   0.12 handoff-p50-ms	  0.14 handoff-p99-ms	  6.6 wait-p99-ms
BenchmarkOther-2                      	     100	       100 ns/op
PASS
ok  	github.com/oversold-lab/oversold/bench	10.471s
`

func parsed(t *testing.T) *report {
	t.Helper()
	r, err := parse(strings.NewReader(input))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParse(t *testing.T) {
	r := parsed(t)
	if got := len(r.servers); got != 2 {
		t.Fatalf("%d servers, want 2 (redis, mysql)", got)
	}
	redis := r.servers[0]
	if redis.name != "redis" || redis.version != "Redis 7.0.15" {
		t.Errorf("server = %q %q, want redis, Redis 7.0.15", redis.name, redis.version)
	}
	if got, want := strings.Join(redis.workloads, ","), "uncontended,hot-8"; got != want {
		t.Errorf("workloads = %s, want %s", got, want)
	}
	if got, want := strings.Join(redis.impls, ","), "ours,slowpeer,fastpeer"; got != want {
		t.Errorf("impls = %s, want %s", got, want)
	}
	if len(redis.waits) != 2 || redis.waits[1] != [2]string{"slowpeer", "retries every 100ms"} {
		t.Errorf("waits = %q", redis.waits)
	}
	for _, c := range []struct {
		workload, impl, unit string
		want                 float64
	}{
		{"hot-8", "ours", acqPerSec, 2000},   // median of 1000 and 3000
		{"hot-8", "ours", handoffP50, 0.40},  // median of 0.5 and 0.3
		{"hot-8", "slowpeer", acqPerSec, 20}, // put back together after the log line
		{"hot-8", "slowpeer", handoffP99, 105},
		{"uncontended", "fastpeer", "ns/op", 150000},
	} {
		got, ok := redis.value(c.workload, c.impl, c.unit)
		if !ok || math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s/%s %s = %v (found %v), want %v", c.workload, c.impl, c.unit, got, ok, c.want)
		}
	}
	if got := r.config["oversold-cpu"]; got != "Test CPU 9000" {
		t.Errorf("cpu = %q", got)
	}
}

func TestBestAndRatios(t *testing.T) {
	redis := parsed(t).servers[0]
	for _, c := range []struct {
		workload, unit string
		higher         bool
		wantPeer       string
		wantRatio      string
	}{
		// Throughput: the highest peer, ours ÷ peer.
		{"uncontended", acqPerSec, true, "5500 slowpeer", "0.91"},
		// Ours ran twice, the peers once: only the first run has a pair.
		{"hot-8", acqPerSec, true, "400 fastpeer", "2.50"},
		// Latency: the lowest peer, peer ÷ ours, so > 1 is still ours better.
		{"hot-8", handoffP50, false, "1.60 fastpeer", "3.20"},
		{"hot-8", handoffP99, false, "1.50 fastpeer", "0.75"},
		// No peer reports a handoff when nobody waits.
		{"uncontended", handoffP50, false, "—", "—"},
	} {
		got := redis.comparison(c.workload, c.unit, c.higher)
		if got[1] != c.wantPeer || got[2] != c.wantRatio {
			t.Errorf("%s %s: best peer %q ratio %q, want %q %q", c.workload, c.unit, got[1], got[2], c.wantPeer, c.wantRatio)
		}
	}
}

func TestWrite(t *testing.T) {
	var b strings.Builder
	parsed(t).write(&b)
	out := b.String()
	for _, want := range []string{
		"Machine: Test CPU 9000, 2 cores, linux 6.1, go1.26.8. Run: 2026-01-02 03:04 UTC, -benchtime 3s.",
		"## redis (Redis 7.0.15)",
		"- slowpeer: retries every 100ms",
		"| hot-8 | 2000 | 400 fastpeer | 2.50 | 0.400 | 1.60 fastpeer | 3.20 | 3.00 | 1.50 fastpeer | 0.75 |",
		"| hot-8 | slowpeer | 20.0 | 100 | 105 | 600 | 92 |",
		"| hot-8 | fastpeer | 400 | 1.60 | 1.50 | 300 | — |",
		// A server where ours did not run still gets its table, with gaps.
		"## mysql (MariaDB 10.11.19)",
		"| hot-8 | — | 1100 get-lock | — |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestFailedRunRefused(t *testing.T) {
	for _, tail := range []string{
		"--- FAIL: BenchmarkRedis/hot-8/ours\n    harness_test.go:250: acquire: boom\n",
		// A run of -count 3 failing: go test prints the failure after the
		// name it had started the result line with.
		"BenchmarkRedlock/hot-32/ours-2   \t--- FAIL: BenchmarkRedlock/hot-32/ours-2\n    harness_test.go:347: acquire: no majority\n",
		"FAIL\tgithub.com/oversold-lab/oversold/bench\t3.2s\n",
		"panic: test timed out after 10m0s\n",
	} {
		var out strings.Builder
		err := run(strings.NewReader(input+tail), &out, "")
		if err == nil || out.Len() != 0 {
			t.Errorf("input ending %q: err %v, %d bytes out; want an error and no table", tail, err, out.Len())
		}
	}
	var out strings.Builder
	if err := run(strings.NewReader(input), &out, ""); err != nil || out.Len() == 0 {
		t.Errorf("a passing run: err %v, %d bytes out", err, out.Len())
	}
}

// Three runs, each printing its own header lines (-count 3): every ratio is
// taken within one run, and the summary gives their median and range.
const threeRuns = `oversold-date: 2026-01-02 03:04 UTC
oversold-server: etcd etcd 3.4.23
oversold-load: etcd 20.5
oversold-impl: etcd ours watches
oversold-impl: etcd peer mutex
BenchmarkEtcd/hot-8/ours-2 	 100	 1 ns/op	 100 acq/s	 2.0 handoff-p50-ms
BenchmarkEtcd/hot-8/peer-2 	 100	 1 ns/op	 50 acq/s	 4.0 handoff-p50-ms
oversold-date: 2026-01-02 03:10 UTC
oversold-server: etcd etcd 3.4.23
oversold-load: etcd 7.25
oversold-impl: etcd ours watches
oversold-impl: etcd peer mutex
BenchmarkEtcd/hot-8/ours-2 	 100	 1 ns/op	 300 acq/s	 1.0 handoff-p50-ms
BenchmarkEtcd/hot-8/peer-2 	 100	 1 ns/op	 400 acq/s	 1.0 handoff-p50-ms
oversold-server: etcd etcd 3.4.23
oversold-load: etcd 30
BenchmarkEtcd/hot-8/ours-2 	 100	 1 ns/op	 200 acq/s	 3.0 handoff-p50-ms
BenchmarkEtcd/hot-8/peer-2 	 100	 1 ns/op	 100 acq/s	 6.0 handoff-p50-ms
`

func TestRepeatedRuns(t *testing.T) {
	r, err := parse(strings.NewReader(threeRuns))
	if err != nil {
		t.Fatal(err)
	}
	etcd := r.servers[0]
	if len(r.servers) != 1 || len(etcd.waits) != 2 {
		t.Fatalf("%d servers, waits %q: want one server, its two implementations once", len(r.servers), etcd.waits)
	}
	// acq/s ratios per run: 2.00, 0.75, 2.00. Medians of the values
	// (200 vs 100) would give 2.00 as well, so the range is what shows
	// the pairing: the 0.75 of the second run.
	if got := etcd.comparison("hot-8", acqPerSec, true); got[0] != "200" || got[1] != "100 peer" || got[2] != "2.00 (0.75-2.00)" {
		t.Errorf("acq/s cells %q, want 200, 100 peer, 2.00 (0.75-2.00)", got)
	}
	// handoff p50, peer ÷ ours per run: 2.00, 1.00, 2.00.
	if got := etcd.comparison("hot-8", handoffP50, false)[2]; got != "2.00 (1.00-2.00)" {
		t.Errorf("handoff ratio %q, want 2.00 (1.00-2.00)", got)
	}
	var b strings.Builder
	r.write(&b)
	out := b.String()
	for _, want := range []string{
		"Run: 2026-01-02 03:04 UTC", // the first run's date
		"Runs: 3.",
		"Load average (1 min) when this server's benchmarks began (each invocation): 20.5, 7.2, 30.0.",
		"| hot-8 | ours | 200 | 2.00 | — | — |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
