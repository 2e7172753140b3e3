package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// fixtureReport is a lab's report with what made the old one hard to read:
// long run names, fault runs whose holders overlapped, refused writes, a
// lost lease, latency over time for many runs, and a fault that does not
// apply to a backend.
func fixtureReport() Report {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	plain := func(backend, guard string, rps float64, oversold int) Result {
		r := Result{Backend: backend, Guard: guard, Replicas: 3, Requests: 600, Status: map[string]int{"201": 100 + oversold, "409": 500 - oversold},
			InitialStock: 100, FinalStock: 0, OrderedQuantity: 100 + oversold, Oversold: oversold, LostUpdates: oversold,
			ThroughputRPS: rps, LatencyMS: Latency{P50: 3.1, P90: 7.9, P99: 14.2, Max: 30.5}, Seed: 1, Safe: oversold == 0}
		for i := range 12 {
			r.OverTime = append(r.OverTime, Slice{At: float64(i) * 0.05, Requests: 50, Created: 8, P50: 3, P99: float64(10 + i*(len(backend)%5))})
		}
		return r
	}
	// A fault run: r3 granted token 4, frozen 1.0 s to 3.0 s; r1 granted
	// token 5 at 2.1 s (two holders), writes; r3 resumes and writes with 4.
	fault := func(backend, guard, name string, refused bool) Result {
		r := plain(backend, guard, 300, 0)
		r.Fault, r.OverTime = name, nil
		leases := []LeaseRecord{
			{Instance: "replica-with-a-long-name-1", Key: "sku/fault-x", Token: 3, AcquiredAt: at(200), ReleasedAt: at(400)},
			{Instance: "r3", Key: "sku/fault-x", Token: 4, AcquiredAt: at(900), LostAt: at(3050), Lost: true},
			{Instance: "replica-with-a-long-name-1", Key: "sku/fault-x", Token: 5, AcquiredAt: at(2100), ReleasedAt: at(2160)},
			{Instance: "r2", Key: "sku/hot", Token: 9, AcquiredAt: at(100), ReleasedAt: at(150)},
		}
		outcome := "committed"
		if refused {
			outcome = "refused"
		}
		writes := []WriteRecord{
			{Instance: "replica-with-a-long-name-1", At: at(350), SKU: "fault-x", Token: 3, Orders: 1, Outcome: "committed"},
			{Instance: "replica-with-a-long-name-1", At: at(2150), SKU: "fault-x", Token: 5, Orders: 1, Outcome: "committed"},
			{Instance: "r3", At: at(3040), SKU: "fault-x", Token: 4, Orders: 1, Outcome: outcome},
		}
		events := []FaultEvent{
			{At: at(1000), Text: "r3 frozen (SIGSTOP) at before-write, holding its lease", Fired: true},
			{At: at(2100), Text: "replica-with-a-long-name-1 took the same lock 1.1s into the pause and writes"},
			{At: at(3000), Text: "r3 resumed (SIGCONT) after 2s and went on with its lost lease"},
		}
		r.Timeline = BuildTimeline(t0, "fault-x", events, leases, writes)
		r.FaultEvents = []string{events[0].Text, events[1].Text, events[2].Text}
		r.Overlaps = len(r.Timeline.Overlaps)
		if refused {
			r.StaleWritesRefused = 1
		} else {
			r.LostUpdates, r.Safe = 1, false
		}
		return r
	}
	notApplicable := func(backend, guard string) Result {
		return Result{Backend: backend, Guard: guard, Fault: "redis-failover", NotApplicable: true,
			Notes: []string{"fault redis-failover does not apply to backend " + backend + " (only redis)"}}
	}
	// Runs on clusters, for the claims table: a failover with two
	// holders, one the guard saved, handoffs and the bus's pub/sub.
	onCluster := func(r Result, p50, p99 float64) Result {
		r.Topology, r.HandoffMS = "cluster", &Wait{Count: 40, P50: p50, P99: p99}
		return r
	}
	clusterRedis := onCluster(plain("redis", "none", 700, 0), 2.4, 56)
	clusterRedis.PubSub = &PubSub{Releases: 90}
	for i := range 6 {
		n := PubSubNode{Addr: fmt.Sprintf("127.0.0.1:4%04d", i), Publish: 1, LockPublish: 0.94}
		if i == 0 {
			n.Publish, n.LockPublish = 0, 0
		}
		if i == 3 {
			n.SPublish = 1
		}
		clusterRedis.PubSub.Nodes = append(clusterRedis.PubSub.Nodes, n)
	}
	failover := func(guard string, refused bool) Result {
		r := fault("redis", guard, "redis-cluster-failover", refused)
		r.Topology = "cluster"
		return r
	}
	// A queue run: 202s faster than the consumers settle them for a
	// while, so a backlog builds and drains.
	queue := plain("none", "atomic", 1500, 0)
	queue.Gate, queue.Accept, queue.Status = "redis", "queue", map[string]int{"202": 100, "409": 500}
	accepted, rejected, lost, pending := 100, 2, 0, 0
	queue.Accepted, queue.RejectedAfterAccept, queue.LostAccepted, queue.PendingLeft = &accepted, &rejected, &lost, &pending
	queue.ConfirmMS = &Wait{Count: 100, Mean: 180, P50: 150, P99: 420}
	backlog := 0
	for i := range 20 {
		sl := QueueSlice{AtS: float64(i) * 0.05, StreamLen: -1, RSSMB: -1}
		if i < 10 {
			sl.Accepted = 10
		}
		sl.Confirmed = min(6, backlog+sl.Accepted)
		if i == 12 {
			sl.Rejected, sl.Confirmed = 2, sl.Confirmed-2
		}
		backlog += sl.Accepted - sl.Confirmed - sl.Rejected
		if i%5 == 0 {
			sl.StreamLen, sl.RSSMB = int64(backlog), 30
		}
		queue.QueueTimeline = append(queue.QueueTimeline, sl)
	}
	results := []Result{
		plain("local", "none", 1000, 198),
		queue,
		plain("redis", "none", 773, 0),
		plain("zookeeper", "none", 282, 0),
		plain("etcd", "version", 252, 0),
		plain("none", "atomic", 998, 0),
		{Backend: "none", Guard: "none", Workload: WorkloadCeiling, Replicas: 3, Requests: 600, Status: map[string]int{"200": 600},
			ThroughputRPS: 4100, LatencyMS: Latency{P50: 1.2, P90: 2.5, P99: 6.1, Max: 9}, Seed: 1, Safe: true},
		fault("redis", "none", "pause-holder", false),
		fault("redis", "fencing", "pause-holder", true),
		fault("zookeeper", "version", "redlock-node-restart-delayed", true),
		notApplicable("zookeeper", "none"),
		notApplicable("zookeeper", "fencing"),
		clusterRedis,
		onCluster(plain("zookeeper", "none", 200, 0), 81, 344),
		onCluster(plain("etcd", "none", 240, 0), 41, 224),
		failover("none", false),
		failover("fencing", true),
	}
	ran, na := SplitApplicable(results)
	return Report{Results: ran, NotApplicable: na, Machine: Machine{CPU: "test CPU", Cores: 2, OS: "linux", Go: "go1.26"},
		Command: "lab --fault pause-holder,redis-failover,redlock-node-restart-delayed --backends redis,zookeeper", Started: t0, Wall: time.Minute}
}

// TestReportInBrowser renders the fixture's report and opens it in a real
// Chromium, on a 1280 px screen and a 390 px phone. OVERSOLD_CHECK_REPORT=DIR
// checks a report folder written by a lab instead (its results.json says
// what to expect).
func TestReportInBrowser(t *testing.T) {
	dir := os.Getenv("OVERSOLD_CHECK_REPORT")
	var results []Result
	notApplicable := 0
	if dir == "" {
		rep := fixtureReport()
		dir = t.TempDir()
		if keep := os.Getenv("OVERSOLD_FIXTURE_OUT"); keep != "" {
			dir = keep // to look at it
		}
		if err := WriteReport(dir, rep); err != nil {
			t.Fatal(err)
		}
		results, notApplicable = rep.Results, len(rep.NotApplicable)
		b, err := os.ReadFile(filepath.Join(dir, ResultsJSON))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), `"not_applicable"`) || strings.Contains(string(b), "redis-failover") {
			t.Errorf("results.json holds the runs that did not apply")
		}
	} else {
		f, err := os.Open(filepath.Join(dir, ResultsJSON))
		if err != nil {
			t.Fatal(err)
		}
		results, err = ReadJSON(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, width := range []int{1280, 390} {
		t.Run(fmt.Sprintf("%dpx", width), func(t *testing.T) {
			checkReport(t, checkInBrowser(t, filepath.Join(dir, ReportHTML), width), width, results, notApplicable)
		})
	}
}

// checkReport checks what the browser found on a report of results.
func checkReport(t *testing.T, page browserPage, width int, results []Result, notApplicable int) {
	for _, p := range page.Problems {
		t.Error(p)
	}
	// The lesson first: the oversold chart before any other.
	if len(page.Charts) == 0 || page.Charts[0] != "invariants" {
		t.Errorf("the charts, in order: %q; want the oversold and lost updates chart (data-chart=invariants) first", page.Charts)
	}
	// Runs coloured by verdict, with a legend naming the colours.
	safe, unsafe := 0, 0
	for _, r := range results {
		if r.Safe {
			safe++
		} else {
			unsafe++
		}
	}
	if len(results) > 0 && len(page.Verdicts) == 0 {
		t.Errorf("no chart colours its runs by verdict (data-verdict)")
	}
	for chart, v := range page.Verdicts {
		if safe > 0 && unsafe > 0 && (len(v.Safe) == 0 || len(v.Unsafe) == 0) {
			t.Errorf("chart %s: runs marked safe %d, unsafe %d; the report has both", chart, len(v.Safe), len(v.Unsafe))
		}
		for _, c := range v.Unsafe {
			if slices.Contains(v.Safe, c) {
				t.Errorf("chart %s: an unsafe run is drawn in %s, as a safe one is", chart, c)
			}
		}
		if !v.Legend {
			t.Errorf("chart %s: no legend names the verdicts' colours", chart)
		}
	}
	// Every results table: the verdict beside the run name, and at
	// 1280 px every column in view without scrolling.
	for _, tb := range page.Tables {
		if tb.Verdict != 1 && tb.Name != "faults" {
			t.Errorf("table %s: the verdict is column %d, want 2, beside the run name (%q)", tb.Name, tb.Verdict+1, tb.Heads)
		}
		if width >= 1280 && tb.Hidden != "" {
			t.Errorf("table %s at %d px: %s", tb.Name, width, tb.Hidden)
		}
	}
	if len(results) > 0 && !slices.ContainsFunc(page.Tables, func(tb browserTable) bool { return tb.Name == "results" }) {
		t.Errorf("no results table")
	}
	// Go's zero values and format errors, anywhere, tooltips included.
	for _, bad := range []string{"<nil>", "%!", "0001-01-01", "NaN", "+Inf"} {
		if strings.Contains(page.AllText, bad) {
			t.Errorf("the page says %s", bad)
		}
	}
	var faults []Result
	for _, r := range results {
		if r.NotApplicable {
			t.Errorf("%s: a run that did not apply is in results.json", r.Name())
		}
		if r.Fault != "" && !r.NotApplicable {
			faults = append(faults, r)
		}
	}
	if len(page.Timelines) != len(faults) {
		t.Errorf("%d timelines, want one per fault run: %d", len(page.Timelines), len(faults))
	}
	for _, r := range faults {
		tl, ok := page.Timelines[fmt.Sprintf("%s seed %d", r.Name(), r.Seed)]
		switch {
		case !ok:
			t.Errorf("%s: no timeline", r.Name())
		case tl.Lanes < r.Replicas:
			t.Errorf("%s: %d lanes, want one per replica (%d)", r.Name(), tl.Lanes, r.Replicas)
		case r.Overlaps > 0 && tl.Overlaps == 0:
			t.Errorf("%s: two holders overlapped %d times, and the timeline marks no overlap", r.Name(), r.Overlaps)
		case r.Overlaps == 0 && tl.Overlaps > 0:
			t.Errorf("%s: the timeline marks %d overlaps in a run that had none", r.Name(), tl.Overlaps)
		case tl.Leases == 0:
			t.Errorf("%s: the timeline draws no lease", r.Name())
		}
		if r.Timeline != nil {
			refused := 0
			for _, w := range r.Timeline.Writes {
				if w.Outcome == "refused" {
					refused++
				}
			}
			if tl.Refused != refused || tl.Writes != len(r.Timeline.Writes) {
				t.Errorf("%s: the timeline marks %d writes, %d refused; the run had %d, %d refused", r.Name(), tl.Writes, tl.Refused, len(r.Timeline.Writes), refused)
			}
			// A stale write's outcome in words: committed or refused.
			stale := 0
			for _, w := range r.Timeline.Writes {
				if staleWrite(r.Timeline, w) && w.Outcome == "committed" {
					stale++
				}
			}
			if refused > 0 && !slices.ContainsFunc(tl.Words, func(w string) bool { return strings.HasSuffix(w, "refused") }) {
				t.Errorf("%s: %d writes refused, and the timeline says none in words (%q)", r.Name(), refused, tl.Words)
			}
			if stale > 0 && !slices.Contains(tl.Words, "stale write committed") {
				t.Errorf("%s: %d stale writes committed, and the timeline does not say so in words (%q)", r.Name(), stale, tl.Words)
			}
		}
	}
	// The claims table: a row per backend that ran on a cluster, as
	// ClaimRows computes it from the runs, and none without one.
	claims := ClaimRows(results)
	if len(page.Claims) != len(claims) {
		t.Errorf("the claims table has %d rows, want %d (%v)", len(page.Claims), len(claims), page.Claims)
	}
	for _, c := range claims {
		got, ok := page.Claims[c.Backend]
		if !ok {
			t.Errorf("the claims table has no row for %s", c.Backend)
			continue
		}
		if strings.Join(got, " | ") != strings.Join(c.Cells, " | ") {
			t.Errorf("claims row %s shows\n %q\nwant\n %q", c.Backend, got, c.Cells)
		}
	}
	// Every queue run: its backlog, accepted and settled over time, shown
	// once, as wide as the window allows and no wider.
	for _, r := range results {
		if r.Accept != "queue" || len(r.QueueTimeline) == 0 {
			continue
		}
		b, ok := page.Backlogs[r.Name()]
		switch {
		case !ok:
			t.Errorf("%s: no backlog chart (accepted and settled over time) at %d px", r.Name(), width)
			continue
		case b.Width > b.Window || b.Width < 0.8*min(b.Window-32, chartWidth):
			t.Errorf("%s: the backlog chart is %.0f px wide in a %.0f px window: not sized to fit", r.Name(), b.Width, b.Window)
		}
		for _, want := range []string{"accepted", "settled", "backlog"} {
			if !slices.Contains(b.Series, want) {
				t.Errorf("%s: the backlog chart draws %q, not %s", r.Name(), b.Series, want)
			}
		}
	}
	if notApplicable > 0 {
		if n := strings.Count(page.Text, "redis-failover on zookeeper"); n != 1 {
			t.Errorf("the pair that did not apply is named %d times, want once", n)
		}
	}
}

// browserPage is what checkInBrowser found on a page.
type browserPage struct {
	Problems  []string
	Text      string // what a reader sees
	AllText   string // with the charts' text and tooltips
	Timelines map[string]struct {
		Lanes, Leases, Overlaps, Writes, Refused int
		Words                                    []string // outcomes written out
	}
	Claims   map[string][]string // the claims table's cells, by backend
	Charts   []string            // data-chart of every chart, in page order
	Verdicts map[string]struct { // per chart, the fills of its safe and unsafe runs
		Safe, Unsafe []string
		Legend       bool
	}
	Tables []browserTable
	// Backlogs: each queue run's backlog chart as shown (the one drawn for
	// the window's width): its width, the window's, and its curves.
	Backlogs map[string]struct {
		Width, Window float64
		Series        []string
	}
}

// browserTable is a results table as the page shows it.
type browserTable struct {
	Name    string
	Heads   []string
	Verdict int    // the verdict's column, from 0
	Hidden  string // what of it is out of view without scrolling its box
}

// pageCheck runs in the page: what is cut off or drawn outside its chart,
// and what each timeline holds.
const pageCheck = `(() => {
  const problems = [];
  const vw = window.innerWidth;
  if (document.documentElement.scrollWidth > vw) problems.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " px wide in a " + vw + " px window");
  for (const svg of document.querySelectorAll("svg")) {
    const name = svg.getAttribute("aria-label") || svg.getAttribute("data-run") || "a chart";
    const box = svg.getBoundingClientRect();
    if (box.right > vw + 0.5) problems.push(name + ": the chart ends at " + Math.round(box.right) + " px, past the window");
    const vb = svg.viewBox.baseVal;
    for (const text of svg.querySelectorAll("text")) {
      const b = text.getBBox();
      if (b.x < vb.x - 0.5 || b.y < vb.y - 0.5 || b.x + b.width > vb.x + vb.width + 0.5 || b.y + b.height > vb.y + vb.height + 0.5)
        problems.push(name + ": text " + JSON.stringify(text.textContent) + " is outside the chart");
    }
  }
  for (const table of document.querySelectorAll("table")) {
    const box = table.parentElement;
    const ox = getComputedStyle(box).overflowX;
    const scrolls = ox === "auto" || ox === "scroll";
    if (box.getBoundingClientRect().right > vw + 0.5) problems.push("a table's box ends past the window");
    if (table.getBoundingClientRect().right > box.getBoundingClientRect().right + 0.5 && !scrolls) problems.push("a table is cut off by its box, which does not scroll");
    for (const cell of table.querySelectorAll("td, th")) {
      if (cell.scrollWidth > cell.clientWidth + 1) problems.push("table cell " + JSON.stringify(cell.textContent) + " is cut off");
    }
  }
  const timelines = {};
  for (const svg of document.querySelectorAll('svg[data-chart="timeline"]')) {
    const run = svg.getAttribute("data-run") + " seed " + svg.getAttribute("data-seed");
    if (timelines[run]) problems.push(run + ": two timelines");
    const leases = svg.querySelectorAll("[data-lease]");
    for (const l of leases) if (!/^[0-9]+$/.test(l.getAttribute("data-token") || "")) problems.push(run + ": a lease without its token");
    timelines[run] = {
      Lanes: svg.querySelectorAll("[data-lane]").length,
      Leases: leases.length,
      Overlaps: svg.querySelectorAll("[data-overlap]").length,
      Writes: svg.querySelectorAll("[data-write]").length,
      Refused: svg.querySelectorAll('[data-write="refused"]').length,
      Words: Array.from(svg.querySelectorAll("[data-write-words]"), t => t.textContent),
    };
  }
  const charts = Array.from(document.querySelectorAll("svg"), svg => svg.getAttribute("data-chart") || "");
  const verdicts = {};
  for (const svg of document.querySelectorAll("svg[data-chart]")) {
    const groups = svg.querySelectorAll("[data-verdict]");
    if (!groups.length) continue;
    const v = {Safe: [], Unsafe: [], Legend: /broke an invariant|kept every invariant/.test(svg.textContent)};
    for (const g of groups) {
      const list = g.getAttribute("data-verdict") === "safe" ? v.Safe : v.Unsafe;
      for (const mark of g.querySelectorAll("rect, polyline")) {
        const c = getComputedStyle(mark);
        const color = mark.tagName === "polyline" ? c.stroke : c.fill;
        if (!list.includes(color)) list.push(color);
      }
    }
    verdicts[svg.getAttribute("data-chart") + (svg.getAttribute("data-chart") in verdicts ? " (again)" : "")] = v;
  }
  const tables = [];
  for (const table of document.querySelectorAll("table")) {
    const heads = Array.from(table.querySelectorAll("thead th"), th => th.textContent.trim());
    if (heads[0] !== "run" && heads[0] !== "scenario") continue; // the claims table is no table of runs
    const box = table.parentElement.getBoundingClientRect();
    let hidden = "";
    if (table.scrollWidth > table.parentElement.clientWidth + 0.5) hidden = "the table is " + table.scrollWidth + " px wide in a " + table.parentElement.clientWidth + " px box: it scrolls";
    const vi = heads.findIndex(h => /^(verdict|safe\?)$/.test(h));
    for (const td of table.querySelectorAll("tbody tr td:nth-child(" + (vi + 1) + ")")) {
      const b = td.getBoundingClientRect();
      if (!hidden && (b.right > box.right + 0.5 || b.right > window.innerWidth + 0.5)) hidden = "the verdict " + JSON.stringify(td.textContent) + " ends at " + Math.round(b.right) + " px, out of view";
    }
    tables.push({Name: table.getAttribute("data-table") || (heads[0] === "scenario" ? "faults" : "results"), Heads: heads, Verdict: vi, Hidden: hidden});
  }
  const claims = {};
  for (const tr of document.querySelectorAll('table[data-table="claims"] tbody tr')) {
    claims[tr.getAttribute("data-backend")] = Array.from(tr.querySelectorAll("td"), td => td.textContent);
  }
  const backlogs = {};
  for (const svg of document.querySelectorAll('svg[data-chart="queue-backlog"]')) {
    const box = svg.getBoundingClientRect();
    if (box.width === 0) continue; // the drawing for the other width
    backlogs[svg.getAttribute("data-run")] = {Width: box.width, Window: vw,
      Series: Array.from(svg.querySelectorAll("[data-series]"), e => e.getAttribute("data-series"))};
  }
  return JSON.stringify({Backlogs: backlogs, Problems: problems, Text: document.body.innerText, AllText: document.documentElement.textContent, Timelines: timelines, Claims: claims, Charts: charts, Verdicts: verdicts, Tables: tables});
})()`

// checkInBrowser opens file in headless Chromium, width px wide, and runs
// pageCheck on it.
func checkInBrowser(t *testing.T, file string, width int) browserPage {
	t.Helper()
	chromium := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			chromium = p
			break
		}
	}
	if chromium == "" {
		if os.Getenv("OVERSOLD_REQUIRE_SERVERS") != "" {
			t.Fatal("no chromium on PATH (make deps installs it)")
		}
		t.Skip("no chromium on PATH: make deps installs it")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.WindowSize(width, 900),
		chromedp.UserDataDir(t.TempDir()),
	)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	abs, err := filepath.Abs(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []chromedp.Action[chromedp.Void]{
		chromedp.EmulateViewport(int64(width), 900),
		chromedp.Navigate("file://" + abs),
		chromedp.WaitReady("body"),
	} {
		if _, err := chromedp.Run(bctx, step); err != nil {
			t.Fatalf("chromium: %v", err)
		}
	}
	out, err := chromedp.Run(bctx, chromedp.Evaluate[string](pageCheck))
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	var page browserPage
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("page check: %v", err)
	}
	if len(page.Problems) > 30 {
		page.Problems = append(page.Problems[:30], fmt.Sprintf("and %d more", len(page.Problems)-30))
	}
	return page
}
