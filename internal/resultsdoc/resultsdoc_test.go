package resultsdoc

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCommittedDocsMatchTheRuns: every generated block of README.md and
// docs/results.md is what the generator makes of the committed runs in
// docs/results/, so no figure there was typed or edited by hand. After a
// new lab run, or an edit inside a block: `make results`.
func TestCommittedDocsMatchTheRuns(t *testing.T) {
	root := filepath.Join("..", "..")
	docs, err := Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range Documents {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "<!-- results:") {
			t.Errorf("%s has no generated block", name)
		}
		if string(b) != docs[name] {
			t.Errorf("%s: a generated block differs from what docs/results/*.json give; run `make results`\n%s", name, firstDiff(string(b), docs[name]))
		}
	}
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return "line " + strconv.Itoa(i+1) + ":\n  committed: " + al[i] + "\n  generated: " + bl[i]
		}
	}
	return "lengths differ"
}

func fixture(t *testing.T) Evidence {
	t.Helper()
	ev, err := Load("testdata")
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestBlocksFromFixture: the figures in each block are the fixture's, and
// computed as the documents say (means over repeats, safe counts).
func TestBlocksFromFixture(t *testing.T) {
	blocks := Blocks(fixture(t))
	for _, c := range []struct{ block, want string }{
		{"headline", "| a mutex in each replica (`local/none`) | 1 | **198** | **198** | **no** |"},
		{"headline", "| one shared lock, no guard (redis, etcd) | 2 | 0 | 0 | 2 of 2 |"},
		{"headline", "| shared lock, no guard, under faults (pause-holder, redis-failover) | 2 | 2 | **4** | 0 of 2 |"},
		{"headline", "**4 of 4** (5 stale writes refused)"},
		// redis/version: two sweep runs, means 2100 orders/s and p99 80 ms.
		{"choose", "| `redis/version` | safe 1/1: pause-holder | 2100, 80 |"},
		{"choose", "| `redis/fencing` | safe 2/2: pause-holder, redis-failover | 1900, 80 |"},
		{"choose", "| `none/atomic` | no lock, no holder: the lock faults do not apply | 800, 150 |"},
		// The fixture's faults ran once per configuration and fault; the
		// sweep's configurations twice, or once (etcd/version).
		{"choose", "every invariant held, 1 seeded runs per fault"},
		{"choose", "one SKU on 3 replicas,\n1000 orders sent as fast as 64 clients allow (unpaced), work inside the lock: 0s; means of 1 to 2 runs, `none/atomic` 2 ([sweep]"},
		// Means, the range of orders/s, and whether the ranges overlap
		// (fencing's below version's under redis, above under zookeeper).
		{"version-vs-fencing", "| redis | 2100 (2000–2200), 80, 1 | 1900 (1900–1900), 80, 0 |"},
		{"version-vs-fencing", "| etcd | 1000 (1000–1000), 100, 0 | 1075 (950–1200), 110, 0 |"},
		{"version-vs-fencing", "overlaps fencing's under etcd (which is faster, these runs do not tell), and is apart from it under redis, zookeeper."},
		{"failover", "| fencing | 1/1 | 0 | 0 | 1 | 4 | 2.8 (2.8) |"},
		{"failover", "| none | 0/1 | 2 | 1 | 0 | 0 | - |"},
		{"choose", "A locked hot SKU sold its 1000 orders in 40 to 64 transactions, the next holder selling together the orders queued for the lock (*coalescing*); `none/atomic`, one decrement per order, in 1000."},
		{"faults", "| redis-failover | none | 0/1 safe, 1 lost upd, **2 oversold** | n/a |"},
		{"lab-time", "`make lab` took 1m30s"},
		{"labs", "Machine: Test CPU, 2 cores, Debian."},
		// Over none/atomic's mean 800, and over the mean of the sweep's own
		// ceiling runs, (4000+6000)/2 = 5000 answers/s.
		{"sweep", "| redis/version | 2 | 2100 | 2000–2200 | 2.62 | 0.42 | 10 | 80 | 1 | 57 | 0 |"},
		{"sweep", "| none/atomic | 2 | 800 | 700–900 | 1.00 | 0.16 |"},
		{"default", "| redis/none | 0 | 0 | yes |"},
	} {
		if !strings.Contains(blocks[c.block], c.want) {
			t.Errorf("block %s lacks %q:\n%s", c.block, c.want, blocks[c.block])
		}
	}
	if strings.Contains(blocks["sweep"], "| none/none |") {
		t.Errorf("the ceiling's runs (GET /healthz) made a row of the sweep's table:\n%s", blocks["sweep"])
	}
	if strings.Contains(blocks["faults"], "redis-failover | fencing | 1/1 safe | n/a") == false {
		t.Errorf("a fault that does not apply (etcd, redis-failover) must be n/a:\n%s", blocks["faults"])
	}
}

// TestGateRowsFromFixture: the stock gate's rows of the decision table
// come from gate.json alone: the gated runs' means (not the ungated
// none/atomic's), their ratio to the mean of the ceiling runs' answers per
// second, their fault runs with what the unsafe ones oversold (and the
// runs without a fault that were unsafe too), and the
// sell-out's answers/s with the gate over without it and over its own
// lab's ceiling.
func TestGateRowsFromFixture(t *testing.T) {
	choose := Blocks(fixture(t))["choose"]
	for _, want := range []string{
		// (1000+1400)/2 = 1200 orders/s, p99 (40+60)/2 = 50, over the ceiling (3000+5000)/2 = 4000.
		"| `none/atomic+gate` | safe 2/2: redis-restart | 1200, 50; 0.30 of the ceiling | one Redis holding the stock counter",
		"| `none/none+gate` | safe 1/2; **unsafe** redis-restart 1/2: **3 oversold**, 100 lost upd; **unsafe without a fault too**: 1/1 runs, 50 lost upd | 1600, 30; 0.40 of the ceiling |",
		// 1200 over the ungated none/atomic's 900 in gate.json (not the sweep's 800).
		"means of 1 to 2 runs, 1 to 2 seeded runs per fault; `none/atomic+gate` at 1.33x `none/atomic` of the same lab; the ceiling, `GET /healthz` through the same balancer and replicas: 4000 answers/s",
		// Guard version's fault runs have no row of their own: the note counts them.
		"; guard `version` beneath the gate under the same faults: safe 2/2: redis-restart, kill-holder;",
		// 800 over the sell-out lab's own ceiling, 1600 (not the sweep's).
		"a sell-out (10000 orders for stock 100, unpaced) answered 800/s with the gate, 2.00x `none/atomic` without it and 0.50 of the same lab's ceiling (1600 answers/s), undersold 2.",
	} {
		if !strings.Contains(choose, want) {
			t.Errorf("the choose block lacks %q:\n%s", want, choose)
		}
	}
	// The ungated none/atomic row still comes from the sweep, not gate.json.
	if !strings.Contains(choose, "| `none/atomic` | no lock, no holder: the lock faults do not apply | 800, 150 |") {
		t.Errorf("the none/atomic row changed:\n%s", choose)
	}
}

// TestQueueRowFromFixture: the queue's row comes from queue.json: 202s
// per second (accepted over the run's duration), the outcome's p99, what
// was lost or left pending, with and without faults, and the ratios to the
// same lab's 201s and ceiling.
func TestQueueRowFromFixture(t *testing.T) {
	choose := Blocks(fixture(t))["choose"]
	for _, want := range []string{
		// 3000/10 = 300 and 3000/6 = 500: 400 accepted/s; p99 (300+500)/2; outcome p99 (700+900)/2.
		// The fault runs of none/atomic only (not guard none's), per fault.
		"| `none/atomic+gate+queue` | queue-consumer-kill safe 1/1; queue-redis-restart safe 0/1: **7 lost** of 59 202s; without faults 1 lost and 2 pending of 2 runs' 202s | 400 accepted (202s), p99 400 ms; the outcome's p99 800 ms after the 202 |",
		// 400 over the sync run's 200 orders/s (not the ceiling's, which
		// orders nothing), and over the lab's ceiling, 1600.
		"4000 orders for stock 3000 at 4000/s offered, means of 2 runs; 202s per second 2.00x the 201s of `none/atomic` in the same lab and 0.25 of its ceiling (1600 answers/s);",
	} {
		if !strings.Contains(choose, want) {
			t.Errorf("the choose block lacks %q:\n%s", want, choose)
		}
	}
}

func TestRewrite(t *testing.T) {
	doc := "intro\n<!-- results:a -->\nold\nlines\n<!-- /results:a -->\nmiddle\n<!-- results:b -->\n<!-- /results:b -->\nend\n"
	got, err := Rewrite(doc, map[string]string{"a": "new\n", "b": "B"})
	if err != nil {
		t.Fatal(err)
	}
	want := "intro\n<!-- results:a -->\nnew\n<!-- /results:a -->\nmiddle\n<!-- results:b -->\nB\n<!-- /results:b -->\nend\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	for _, bad := range []string{
		"<!-- results:c -->\nx\n<!-- /results:c -->\n", // no generator
		"<!-- results:a -->\nx\n<!-- /results:b -->\n", // crossed markers
		"<!-- results:a -->\nx\n",                      // never ends
	} {
		if _, err := Rewrite(bad, map[string]string{"a": "A", "b": "B"}); err == nil {
			t.Errorf("Rewrite(%q) = nil error", bad)
		}
	}
}

func TestParseHeader(t *testing.T) {
	md := "# oversold lab results\n\n`lab --sweep --out /tmp/x --orderd /tmp/y/orderd --backends redis`, 2026-01-02 03:04 UTC, 2m10s wall time.\n\nMachine: Some CPU, 2 cores, Debian (Linux 6.1), go1.26.\n\n| run |"
	lab, err := parseHeader(md)
	if err != nil {
		t.Fatal(err)
	}
	want := Lab{Command: "go run ./cmd/lab --sweep --backends redis", Wall: "2m10s", Machine: "Some CPU, 2 cores, Debian (Linux 6.1), go1.26"}
	if lab != want {
		t.Errorf("got %+v, want %+v", lab, want)
	}
}

// TestSweepTableOfPlainRuns: a sweep that crossed --gates and --accept
// leaves the sweep's table of locks and guards as it was: a gated or queued
// none/atomic is not the reference. (The fixture's ceiling runs are
// TestBlocksFromFixture's.)
func TestSweepTableOfPlainRuns(t *testing.T) {
	ev := fixture(t)
	want := Blocks(ev)["sweep"]
	for _, r := range []Run{
		{Backend: "none", Guard: "atomic", Gate: "redis", SKUs: 1, OrdersRPS: 99999},
		{Backend: "none", Guard: "atomic", Gate: "redis", Accept: "queue", SKUs: 1, OrdersRPS: 0, ThroughputRPS: 99999},
	} {
		ev.Sweep = append(ev.Sweep, r)
	}
	if got := Blocks(ev)["sweep"]; got != want {
		t.Errorf("the sweep's table changed with gated and queued runs:\n%s\nwant\n%s", got, want)
	}
}

// TestRunNames: runs are named as the lab names them, so a gated or queued
// run's row in a table is not taken for the plain configuration's.
func TestRunNames(t *testing.T) {
	for _, c := range []struct {
		run  Run
		want string
	}{
		{Run{Backend: "redis", Guard: "version"}, "redis/version"},
		{Run{Backend: "none", Guard: "atomic", Gate: "redis"}, "none/atomic+gate"},
		{Run{Backend: "none", Guard: "atomic", Gate: "redis", Accept: "queue"}, "none/atomic+gate+queue"},
		{Run{Backend: "none", Guard: "none", Workload: "ceiling"}, "ceiling"},
	} {
		if got := c.run.Name(); got != c.want {
			t.Errorf("%+v named %q, want %q", c.run, got, c.want)
		}
	}
}
