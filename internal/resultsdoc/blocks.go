package resultsdoc

import (
	"fmt"
	"slices"
	"strings"
)

// Blocks renders every block the documents may hold.
func Blocks(ev Evidence) map[string]string {
	return map[string]string{
		"headline":           headline(ev),
		"choose":             choose(ev),
		"version-vs-fencing": versionVsFencing(ev),
		"failover":           failover(ev),
		"lab-time":           labTime(ev),
		"labs":               labs(ev),
		"default":            defaultTable(ev),
		"sweep":              sweepTable(ev),
		"faults":             faultTable(ev),
	}
}

// Lock backends in the order the lab runs them; "none" is no lock.
var lockOrder = []string{"local", "redis", "redlock", "zookeeper", "mysql", "etcd", "none"}

var guardOrder = []string{"none", "version", "fencing", "atomic"}

func orderOf(list []string, s string) int {
	if i := slices.Index(list, s); i >= 0 {
		return i
	}
	return len(list)
}

// orders keeps the direct-order runs of a lab (not the reservations).
func orders(runs []Run) []Run {
	var out []Run
	for _, r := range runs {
		if r.Workload == "" && r.Error == "" {
			out = append(out, r)
		}
	}
	return out
}

func find(runs []Run, backend, guard string) (Run, bool) {
	for _, r := range runs {
		if r.Backend == backend && r.Guard == guard {
			return r, true
		}
	}
	return Run{}, false
}

// tally is what a set of runs of one configuration found.
type tally struct {
	runs, safe, fired        int
	overlaps, lost, oversold int
	refused, unavailable     int
	undersold                int
}

func count(runs []Run) tally {
	var t tally
	for _, r := range runs {
		t.runs++
		if r.Safe {
			t.safe++
		}
		if !r.NotFired {
			t.fired++
		}
		t.overlaps += r.Overlaps
		t.lost += r.LostUpdates
		t.oversold += r.Oversold
		t.refused += r.StaleRefused
		t.unavailable += r.Status["503"]
		t.undersold += r.Undersold
	}
	return t
}

func (t tally) cell() string {
	if t.runs == 0 {
		return "n/a"
	}
	s := fmt.Sprintf("%d/%d safe", t.safe, t.runs)
	if t.lost > 0 || t.oversold > 0 {
		s += fmt.Sprintf(", %d lost upd", t.lost)
	}
	if t.oversold > 0 {
		s += fmt.Sprintf(", **%d oversold**", t.oversold)
	}
	if t.fired < t.runs {
		s += fmt.Sprintf(" (%d fired)", t.fired)
	}
	return s
}

func filter(runs []Run, keep func(Run) bool) []Run {
	var out []Run
	for _, r := range runs {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// faultNames are the faults of the matrix, in the order they first appear.
func faultNames(runs []Run) []string {
	var names []string
	for _, r := range runs {
		if r.Fault != "" && !slices.Contains(names, r.Fault) {
			names = append(names, r.Fault)
		}
	}
	return names
}

// mean is the mean of f over runs.
func mean(runs []Run, f func(Run) float64) float64 {
	if len(runs) == 0 {
		return 0
	}
	var sum float64
	for _, r := range runs {
		sum += f(r)
	}
	return sum / float64(len(runs))
}

// hot is the sweep's runs of one configuration on its hot-SKU cell: orders
// answered 201 with no gate, not the ceiling's GETs nor a gated or queued
// run of the same lock and guard, which a sweep crossing --gates and
// --accept holds too.
func hot(ev Evidence, backend, guard string) []Run {
	return filter(ev.Sweep, func(r Run) bool {
		return r.Backend == backend && r.Guard == guard && r.SKUs == 1 && r.Error == "" && plainSweepRun(r)
	})
}

// plainSweepRun: a sweep run of a lock and guard alone.
func plainSweepRun(r Run) bool { return r.Gate == "" && r.Accept == "" && r.Workload == "" }

// sweepCeiling is the mean answers per second of the sweep's ceiling runs
// on its hot-SKU cell (GET /healthz through the same balancer and
// replicas), 0 if it ran none.
func sweepCeiling(ev Evidence) float64 {
	runs := filter(ev.Sweep, func(r Run) bool { return r.Workload == "ceiling" && r.SKUs == 1 && r.Error == "" })
	return mean(runs, func(r Run) float64 { return r.ThroughputRPS })
}

func headline(ev Evidence) string {
	def := orders(ev.Default)
	var b strings.Builder
	b.WriteString("| setup | runs | oversold | lost updates | every invariant held |\n|---|---|---:|---:|---|\n")
	if r, ok := find(def, "local", "none"); ok {
		fmt.Fprintf(&b, "| a mutex in each replica (`local/none`) | 1 | **%d** | **%d** | %s |\n", r.Oversold, r.LostUpdates, yesNo(r.Safe))
	}
	shared := filter(def, func(r Run) bool { return r.Guard == "none" && r.Backend != "local" && r.Backend != "none" })
	t := count(shared)
	fmt.Fprintf(&b, "| one shared lock, no guard (%s) | %d | %d | %d | %d of %d |\n",
		backendList(shared), t.runs, t.oversold, t.lost, t.safe, t.runs)
	lease := func(r Run) bool { return r.Backend != "none" }
	t = count(filter(ev.Faults, func(r Run) bool { return lease(r) && r.Guard == "none" }))
	fmt.Fprintf(&b, "| shared lock, no guard, under faults (%s) | %d | %d | **%d** | %d of %d |\n",
		strings.Join(faultNames(ev.Faults), ", "), t.runs, t.oversold, t.lost, t.safe, t.runs)
	t = count(filter(ev.Faults, func(r Run) bool { return lease(r) && (r.Guard == "version" || r.Guard == "fencing") }))
	fmt.Fprintf(&b, "| shared lock + guard `version` or `fencing`, same faults | %d | %d | %d | **%d of %d** (%d stale writes refused) |\n",
		t.runs, t.oversold, t.lost, t.safe, t.runs, t.refused)
	return b.String()
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

func backendList(runs []Run) string {
	var names []string
	for _, r := range runs {
		if !slices.Contains(names, r.Backend) {
			names = append(names, r.Backend)
		}
	}
	return strings.Join(names, ", ")
}

// A choice is one row of the decision table; the situation and what is
// operated are words, every figure comes from the runs.
type choice struct {
	situation, backend, guard, operate string
}

var choices = []choice{
	{"You run Redis already: **the default pick**", "redis", "version", "one Redis (Sentinel or Cluster for failover) and MySQL"},
	{"Redis, and a refused stale write must abort (409) rather than retry", "redis", "fencing", "as above; a `fence` column beside `version`"},
	{"Kubernetes or etcd at hand; the lock must outlive a server's failure", "etcd", "fencing", "a 3-member etcd cluster"},
	{"ZooKeeper at hand", "zookeeper", "fencing", "a 3-node ZooKeeper ensemble"},
	{"Nothing but MySQL", "mysql", "version", "nothing more: the leases live in MySQL"},
	{"Independent Redis masters (Redlock)", "redlock", "version", "3 or 5 Redis masters; no fencing token"},
	{"Only a stock decrement, no work between read and write", "none", "atomic", "nothing: no lock"},
}

func choose(ev Evidence) string {
	var b strings.Builder
	b.WriteString("| your situation | lock + guard | under the fault runs | hot SKU: orders/s, p99 ms | you operate |\n|---|---|---|---|---|\n")
	for _, c := range choices {
		fmt.Fprintf(&b, "| %s | `%s/%s` | %s | %s | %s |\n", c.situation, c.backend, c.guard,
			survives(ev, c.backend, c.guard), hotCell(ev, c.backend, c.guard), c.operate)
	}
	for _, c := range gateChoices {
		if len(gateHot(ev, c.backend, c.guard)) > 0 {
			fmt.Fprintf(&b, "| %s | `%s/%s+gate` | %s | %s | %s |\n", c.situation, c.backend, c.guard,
				gateSurvives(ev, c.backend, c.guard), gateHotCell(ev, c.backend, c.guard), c.operate)
		}
	}
	if row := queueRow(ev); row != "" {
		b.WriteString(row)
	}
	fmt.Fprintf(&b, "\n*Under the fault runs*: runs where every invariant held, %s seeded runs per fault, "+
		"of the faults that apply to that lock ([matrix](docs/results.md#faults)).\n",
		repeats(ev.Faults, func(r Run) string { return r.Name() + " " + r.Fault }))
	swept := filter(ev.Sweep, func(r Run) bool { return r.SKUs == 1 && r.Error == "" && r.Workload == "" })
	if len(swept) > 0 {
		r := swept[0]
		n := repeats(filter(swept, func(r Run) bool { return r.Name() != "none/atomic" }), Run.Name)
		if a := len(hot(ev, "none", "atomic")); a > 0 && fmt.Sprint(a) != n {
			n += fmt.Sprintf(" runs, `none/atomic` %d", a)
		} else {
			n += " runs"
		}
		fmt.Fprintf(&b, "*Hot SKU*: orders placed (201) per second and 99th-percentile answer time, one SKU on %d replicas,\n"+
			"%d orders sent as fast as %d clients allow (unpaced), work inside the lock: %s; means of %s ([sweep](docs/results.md#a-hot-sku-what-each-lock-and-guard-costs)).\n",
			r.Replicas, r.Requests, r.Workers, r.WorkDelay, n)
	}
	b.WriteString(coalescing(ev) + "\n")
	b.WriteString(gateNote(ev))
	b.WriteString(queueNote(ev))
	return b.String()
}

// repeats says how many runs each configuration had, "5" or "3 to 5".
func repeats(runs []Run, key func(Run) string) string {
	n := map[string]int{}
	for _, r := range runs {
		n[key(r)]++
	}
	lo, hi := 0, 0
	for _, c := range n {
		if lo == 0 || c < lo {
			lo = c
		}
		hi = max(hi, c)
	}
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d to %d", lo, hi)
}

// survives says which faults a configuration came through, from the
// fault matrix.
func survives(ev Evidence, backend, guard string) string {
	if backend == "none" {
		return "no lock, no holder: the lock faults do not apply"
	}
	return survivesIn(filter(ev.Faults, func(r Run) bool { return r.Backend == backend && r.Guard == guard }))
}

// survivesIn says which faults runs (of one configuration) came through.
func survivesIn(runs []Run) string {
	if len(runs) == 0 {
		return "not run"
	}
	var safe, unsafe []string
	for _, f := range faultNames(runs) {
		t := count(filter(runs, func(r Run) bool { return r.Fault == f }))
		if t.safe == t.runs {
			safe = append(safe, f)
		} else {
			unsafe = append(unsafe, fmt.Sprintf("%s %d/%d", f, t.runs-t.safe, t.runs))
		}
	}
	t := count(runs)
	s := fmt.Sprintf("safe %d/%d", t.safe, t.runs)
	if len(safe) > 0 {
		s += ": " + strings.Join(safe, ", ")
	}
	if len(unsafe) > 0 {
		s += "; **unsafe** " + strings.Join(unsafe, ", ")
	}
	return s
}

func hotCell(ev Evidence, backend, guard string) string {
	runs := hot(ev, backend, guard)
	if len(runs) == 0 {
		return "not run"
	}
	return fmt.Sprintf("%.0f, %.0f", mean(runs, func(r Run) float64 { return r.OrdersRPS }),
		mean(runs, func(r Run) float64 { return r.LatencyMS.P99 }))
}

func versionVsFencing(ev Evidence) string {
	var b strings.Builder
	b.WriteString("| lock | version: orders/s (min–max), p99 ms, refused writes | fencing: orders/s (min–max), p99 ms, refused writes |\n|---|---|---|\n")
	cell := func(runs []Run) string {
		if len(runs) == 0 {
			return "n/a (no fencing token)"
		}
		lo, hi := spread(runs)
		return fmt.Sprintf("%.0f (%.0f–%.0f), %.0f, %.0f", mean(runs, func(r Run) float64 { return r.OrdersRPS }), lo, hi,
			mean(runs, func(r Run) float64 { return r.LatencyMS.P99 }),
			mean(runs, func(r Run) float64 { return float64(r.Conflicts) }))
	}
	var overlap, apart []string
	for _, backend := range lockOrder {
		v, f := hot(ev, backend, "version"), hot(ev, backend, "fencing")
		if backend == "local" || backend == "none" || len(v) == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", backend, cell(v), cell(f))
		if len(f) > 0 {
			vlo, vhi := spread(v)
			flo, fhi := spread(f)
			if vlo <= fhi && flo <= vhi {
				overlap = append(overlap, backend)
			} else {
				apart = append(apart, backend)
			}
		}
	}
	if runs := hot(ev, "none", "version"); len(runs) > 0 {
		fmt.Fprintf(&b, "| none (no lock): `none/version` | %s | n/a |\n", cell(runs))
	}
	b.WriteString("\n")
	switch {
	case len(apart) == 0:
		fmt.Fprintf(&b, "Under every lock with both (%s), version's orders/s range overlaps fencing's: which is faster, these runs do not tell.\n", strings.Join(overlap, ", "))
	case len(overlap) == 0:
		fmt.Fprintf(&b, "Under every lock with both (%s), version's orders/s range and fencing's are apart.\n", strings.Join(apart, ", "))
	default:
		fmt.Fprintf(&b, "Version's orders/s range overlaps fencing's under %s (which is faster, these runs do not tell), and is apart from it under %s.\n",
			strings.Join(overlap, ", "), strings.Join(apart, ", "))
	}
	return b.String()
}

// spread is the lowest and the highest orders/s of runs.
func spread(runs []Run) (lo, hi float64) {
	for i, r := range runs {
		if i == 0 || r.OrdersRPS < lo {
			lo = r.OrdersRPS
		}
		hi = max(hi, r.OrdersRPS)
	}
	return lo, hi
}

func failover(ev Evidence) string {
	var b strings.Builder
	b.WriteString("| guard | runs safe | oversold | lost updates | stale writes refused | 503 answers | orders resumed after: median s (longest) |\n|---|---|---:|---:|---:|---:|---|\n")
	for _, g := range guardOrder {
		runs := filter(ev.Faults, func(r Run) bool { return r.Backend == "redis" && r.Guard == g && r.Fault == "redis-failover" })
		if len(runs) == 0 {
			continue
		}
		t := count(runs)
		fmt.Fprintf(&b, "| %s | %d/%d | %d | %d | %d | %d | %s |\n", g, t.safe, t.runs, t.oversold, t.lost, t.refused, t.unavailable, recovery(runs))
	}
	return b.String()
}

// recovery is the median and the longest time the runs took to take
// orders again after the fault, where the scenario measured it.
func recovery(runs []Run) string {
	var ms []float64
	for _, r := range runs {
		if r.RecoveryMS != nil {
			ms = append(ms, *r.RecoveryMS)
		}
	}
	if len(ms) == 0 {
		return "-"
	}
	slices.Sort(ms)
	return fmt.Sprintf("%.1f (%.1f)", ms[(len(ms)-1)/2]/1000, ms[len(ms)-1]/1000)
}

// coalescing says how many transactions the sweep's locked hot SKU sold
// its orders in, against the lock-free reference's one per order.
func coalescing(ev Evidence) string {
	locked := filter(ev.Sweep, func(r Run) bool {
		return r.SKUs == 1 && r.Error == "" && r.Backend != "none" && r.Backend != "local" && r.Batches.Writes > 0
	})
	atomic := filter(hot(ev, "none", "atomic"), func(r Run) bool { return r.Batches.Writes > 0 })
	if len(locked) == 0 || len(atomic) == 0 {
		return ""
	}
	lo, hi, orders := 0, 0, 0
	for i, r := range locked {
		if i == 0 || r.Batches.Writes < lo {
			lo = r.Batches.Writes
		}
		hi = max(hi, r.Batches.Writes)
		orders = max(orders, r.Batches.Orders)
	}
	return fmt.Sprintf("A locked hot SKU sold its %d orders in %d to %d transactions, the next holder selling together the orders queued for the lock (*coalescing*); `none/atomic`, one decrement per order, in %d.",
		orders, lo, hi, atomic[0].Batches.Writes)
}

func labTime(ev Evidence) string {
	for _, l := range ev.Labs {
		if l.Name == "default" {
			return fmt.Sprintf("Measured here, `make lab` took %s (servers started once, then %d runs).", l.Wall, len(ev.Default))
		}
	}
	return "The default lab has not been run for these documents."
}

func labs(ev Evidence) string {
	var b strings.Builder
	var machines []string
	for _, l := range ev.Labs {
		if !slices.Contains(machines, l.Machine) {
			machines = append(machines, l.Machine)
		}
	}
	fmt.Fprintf(&b, "Machine: %s.\n\n", strings.Join(machines, "; "))
	b.WriteString("| results file | command | wall time |\n|---|---|---|\n")
	for _, l := range ev.Labs {
		fmt.Fprintf(&b, "| [docs/results/%s.json](results/%s.json) | `%s` | %s |\n", l.Name, l.Name, l.Command, l.Wall)
	}
	return b.String()
}

func defaultTable(ev Evidence) string {
	var b strings.Builder
	b.WriteString("| run | answers | sold / stock | oversold | lost updates | lost acks | duplicates | req/s | p50 ms | p99 ms | refused writes | safe |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range orders(ev.Default) {
		fmt.Fprintf(&b, "| %s | %s | %d / %d | %d | %d | %d | %d | %.0f | %.1f | %.1f | %d | %s |\n",
			r.Name(), answers(r), r.OrderedQuantity, r.InitialStock, r.Oversold, r.LostUpdates, r.LostAcks, r.Duplicates,
			r.ThroughputRPS, r.LatencyMS.P50, r.LatencyMS.P99, r.Conflicts, yesNo(r.Safe))
	}
	res := filter(ev.Default, func(r Run) bool { return r.Workload != "" })
	if len(res) > 0 {
		b.WriteString("\nCheckouts (`--workload reservations`, one run per backend):\n\n| run | oversold | lost updates | safe |\n|---|---:|---:|---|\n")
		for _, r := range res {
			fmt.Fprintf(&b, "| %s | %d | %d | %s |\n", r.Name(), r.Oversold, r.LostUpdates, yesNo(r.Safe))
		}
	}
	return b.String()
}

func answers(r Run) string {
	var codes []string
	for c := range r.Status {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	var parts []string
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%s×%d", c, r.Status[c]))
	}
	return strings.Join(parts, " ")
}

func sweepTable(ev Evidence) string {
	type key struct{ backend, guard string }
	var keys []key
	for _, r := range ev.Sweep {
		k := key{r.Backend, r.Guard}
		if r.SKUs == 1 && plainSweepRun(r) && !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	slices.SortStableFunc(keys, func(a, b key) int {
		if d := orderOf(lockOrder, a.backend) - orderOf(lockOrder, b.backend); d != 0 {
			return d
		}
		return orderOf(guardOrder, a.guard) - orderOf(guardOrder, b.guard)
	})
	ref := mean(hot(ev, "none", "atomic"), func(r Run) float64 { return r.OrdersRPS })
	top := sweepCeiling(ev)
	ratio := func(o, to float64) string {
		if to > 0 {
			return fmt.Sprintf("%.2f", o/to)
		}
		return "-"
	}
	var b strings.Builder
	b.WriteString("| run | runs | orders/s | min–max | ratio to none/atomic | ratio to the ceiling | p50 ms | p99 ms | refused writes | transactions | lost updates |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, k := range keys {
		runs := hot(ev, k.backend, k.guard)
		o := mean(runs, func(r Run) float64 { return r.OrdersRPS })
		lo, hi := spread(runs)
		fmt.Fprintf(&b, "| %s/%s | %d | %.0f | %.0f–%.0f | %s | %s | %.0f | %.0f | %.0f | %.0f | %d |\n", k.backend, k.guard, len(runs), o, lo, hi, ratio(o, ref), ratio(o, top),
			mean(runs, func(r Run) float64 { return r.LatencyMS.P50 }),
			mean(runs, func(r Run) float64 { return r.LatencyMS.P99 }),
			mean(runs, func(r Run) float64 { return float64(r.Conflicts) }),
			mean(runs, func(r Run) float64 { return float64(r.Batches.Writes) }),
			count(runs).lost)
	}
	return b.String()
}

func faultTable(ev Evidence) string {
	var backends []string
	for _, r := range ev.Faults {
		if !slices.Contains(backends, r.Backend) {
			backends = append(backends, r.Backend)
		}
	}
	slices.SortFunc(backends, func(a, b string) int { return orderOf(lockOrder, a) - orderOf(lockOrder, b) })
	var b strings.Builder
	b.WriteString("| fault | guard | " + strings.Join(backends, " | ") + " |\n|---|---|" + strings.Repeat("---|", len(backends)) + "\n")
	for _, f := range faultNames(ev.Faults) {
		for _, g := range guardOrder {
			row := filter(ev.Faults, func(r Run) bool { return r.Fault == f && r.Guard == g })
			if len(row) == 0 {
				continue
			}
			cells := make([]string, len(backends))
			for i, backend := range backends {
				cells[i] = count(filter(row, func(r Run) bool { return r.Backend == backend })).cell()
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", f, g, strings.Join(cells, " | "))
		}
	}
	return b.String()
}

// gateChoices are the decision table's rows for the stock gate
// (OVERSOLD_GATE=redis), from gate.json.
var gateChoices = []choice{
	{"A flash sale: the stock gate in Redis takes the stock first, the conditional UPDATE beneath", "none", "atomic",
		"one Redis holding the stock counter (given back by a back-check against MySQL), and MySQL"},
	{"The peers' design, trusting the gate (MySQL decremented without a condition): **never**", "none", "none",
		"as above; MySQL no longer checks the stock"},
}

// gateRuns are gate.json's runs of the gated configuration backend/guard.
func gateRuns(ev Evidence, backend, guard string) []Run {
	return filter(ev.Gate, func(r Run) bool {
		return r.Backend == backend && r.Guard == guard && r.Gate != "" && r.Workload == "" && r.Error == ""
	})
}

// soldOut: the run offered more orders than its stock (the others are the
// sweep's, whose stock covers every order).
func soldOut(r Run) bool { return r.InitialStock < r.Requests }

// gateHot is the gate sweep's hot-SKU runs of a gated configuration.
func gateHot(ev Evidence, backend, guard string) []Run {
	return filter(gateRuns(ev, backend, guard), func(r Run) bool { return r.Fault == "" && r.SKUs == 1 && !soldOut(r) })
}

// ceiling is the mean answers per second of gate.json's ceiling runs
// (GET /healthz through the same balancer and replicas) of the lab that
// sent requests requests (the sweep's or the sell-out's), 0 if none ran.
func ceiling(ev Evidence, requests int) float64 {
	runs := filter(ev.Gate, func(r Run) bool { return r.Workload == "ceiling" && r.Error == "" && r.Requests == requests })
	return mean(runs, func(r Run) float64 { return r.ThroughputRPS })
}

func gateSurvives(ev Evidence, backend, guard string) string {
	runs := filter(gateRuns(ev, backend, guard), func(r Run) bool { return r.Fault != "" })
	s := survivesIn(runs)
	if t := count(runs); t.oversold > 0 {
		s += fmt.Sprintf(": **%d oversold**, %d lost upd", t.oversold, t.lost)
	}
	if t := count(gateHot(ev, backend, guard)); t.safe < t.runs {
		s += fmt.Sprintf("; **unsafe without a fault too**: %d/%d runs, %d lost upd", t.runs-t.safe, t.runs, t.lost)
	}
	return s
}

// gateHotCell is hotCell's figures for a gated configuration, and its
// orders/s as a ratio to the ceiling of the same lab.
func gateHotCell(ev Evidence, backend, guard string) string {
	runs := gateHot(ev, backend, guard)
	o := mean(runs, func(r Run) float64 { return r.OrdersRPS })
	s := fmt.Sprintf("%.0f, %.0f", o, mean(runs, func(r Run) float64 { return r.LatencyMS.P99 }))
	if len(runs) == 0 {
		return s
	}
	if top := ceiling(ev, runs[0].Requests); top > 0 {
		s += fmt.Sprintf("; %.2f of the ceiling", o/top)
	}
	return s
}

// gateNote says where the gate's rows come from: their runs, the ceiling,
// and the sell-out with and without the gate.
func gateNote(ev Evidence) string {
	runs := gateHot(ev, "none", "atomic")
	if len(runs) == 0 {
		return ""
	}
	s := fmt.Sprintf("*The gate's rows* ([gate.json](docs/results/gate.json)): the same hot SKU, means of %s runs, %s seeded runs per fault",
		repeats(filter(ev.Gate, func(r Run) bool { return r.Gate != "" && r.Fault == "" && r.SKUs == 1 && !soldOut(r) }), Run.Name),
		repeats(filter(ev.Gate, func(r Run) bool { return r.Gate != "" && r.Fault != "" }), func(r Run) string { return r.Name() + " " + r.Fault }))
	ref := filter(ev.Gate, func(r Run) bool {
		return r.Backend == "none" && r.Guard == "atomic" && r.Gate == "" && r.Fault == "" && r.Workload == "" && r.Error == "" && r.SKUs == 1 && !soldOut(r)
	})
	if o := mean(ref, func(r Run) float64 { return r.OrdersRPS }); o > 0 {
		s += fmt.Sprintf("; `none/atomic+gate` at %.2fx `none/atomic` of the same lab", mean(runs, func(r Run) float64 { return r.OrdersRPS })/o)
	}
	if top := ceiling(ev, runs[0].Requests); top > 0 {
		s += fmt.Sprintf("; the ceiling, `GET /healthz` through the same balancer and replicas: %.0f answers/s", top)
	}
	if v := filter(gateRuns(ev, "none", "version"), func(r Run) bool { return r.Fault != "" }); len(v) > 0 {
		s += "; guard `version` beneath the gate under the same faults: " + survivesIn(v)
		if t := count(v); t.oversold > 0 {
			s += fmt.Sprintf(", **%d oversold**", t.oversold)
		}
	}
	sale := func(gated bool) []Run {
		return filter(ev.Gate, func(r Run) bool {
			return r.Backend == "none" && r.Guard == "atomic" && (r.Gate != "") == gated && r.Fault == "" && r.Workload == "" && r.Error == "" && soldOut(r)
		})
	}
	with, without := sale(true), sale(false)
	if len(with) > 0 && len(without) > 0 {
		rps := func(r Run) float64 { return r.ThroughputRPS }
		s += fmt.Sprintf("; a sell-out (%d orders for stock %d, unpaced) answered %.0f/s with the gate, %.2fx `none/atomic` without it",
			with[0].Requests, with[0].InitialStock, mean(with, rps), mean(with, rps)/mean(without, rps))
		if top := ceiling(ev, with[0].Requests); top > 0 {
			s += fmt.Sprintf(" and %.2f of the same lab's ceiling (%.0f answers/s)", mean(with, rps)/top, top)
		}
		s += fmt.Sprintf(", undersold %d", count(with).undersold)
	}
	return s + ".\n"
}

// queueRuns are queue.json's runs answered 202 (OVERSOLD_ACCEPT=queue).
func queueRuns(ev Evidence) []Run {
	return filter(ev.Queue, func(r Run) bool { return r.Accept == "queue" && r.Fault == "" && r.Error == "" && r.Accepted != nil })
}

// queueRow is the decision table's row for the order queue: 202s per
// second and how long a customer waits for the outcome.
func queueRow(ev Evidence) string {
	runs := queueRuns(ev)
	if len(runs) == 0 {
		return ""
	}
	r := runs[0]
	lost, pending := 0, 0
	for _, q := range runs {
		lost += deref(q.LostAccepted)
		pending += deref(q.PendingLeft)
	}
	accepted := mean(runs, func(r Run) float64 { return float64(*r.Accepted) / r.DurationS })
	confirm := mean(runs, func(r Run) float64 { return r.ConfirmMS.P99 })
	return fmt.Sprintf("| Accept now, write later: 202 once the gate took the stock, a consumer writes MySQL | `%s/%s+gate+queue` | "+
		"%s; without faults %d lost and %d pending of %d runs' 202s | %.0f accepted (202s), p99 %.0f ms; the outcome's p99 %.0f ms after the 202 | "+
		"one Redis holding the gate and the stream (`appendfsync always` to keep what it accepted through a crash), MySQL |\n",
		r.Backend, r.Guard, queueFaults(ev, r.Backend, r.Guard), lost, pending, len(runs), accepted, mean(runs, func(r Run) float64 { return r.LatencyMS.P99 }), confirm)
}

// queueFaults says, per fault, how many of the queue's fault runs of
// backend/guard were safe, and what the others lost: accepted orders lost
// or left pending, oversold, duplicates.
func queueFaults(ev Evidence, backend, guard string) string {
	faults := filter(ev.Queue, func(r Run) bool {
		return r.Accept == "queue" && r.Fault != "" && r.Backend == backend && r.Guard == guard && r.Error == "" && !r.NotApplicable && r.Accepted != nil
	})
	if len(faults) == 0 {
		return "no fault runs yet"
	}
	var parts []string
	for _, f := range faultNames(faults) {
		runs := filter(faults, func(r Run) bool { return r.Fault == f })
		safe, accepted, lost, pending, oversold, dup := 0, 0, 0, 0, 0, 0
		for _, r := range runs {
			if r.Safe {
				safe++
			}
			accepted += *r.Accepted
			lost += deref(r.LostAccepted)
			pending += deref(r.PendingLeft)
			oversold += r.Oversold
			dup += r.Duplicates
		}
		s := fmt.Sprintf("%s safe %d/%d", f, safe, len(runs))
		var bad []string
		if lost > 0 {
			bad = append(bad, fmt.Sprintf("**%d lost** of %d 202s", lost, accepted))
		}
		if pending > 0 {
			bad = append(bad, fmt.Sprintf("**%d pending**", pending))
		}
		if oversold > 0 {
			bad = append(bad, fmt.Sprintf("**%d oversold**", oversold))
		}
		if dup > 0 {
			bad = append(bad, fmt.Sprintf("**%d duplicates**", dup))
		}
		if len(bad) > 0 {
			s += ": " + strings.Join(bad, ", ")
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// queueNote says where the queue's row comes from and how it compares
// with the same lab's synchronous orders and, when the lab measured one,
// its ceiling.
func queueNote(ev Evidence) string {
	runs := queueRuns(ev)
	sync := filter(ev.Queue, func(r Run) bool {
		return r.Accept == "" && r.Gate == "" && r.Fault == "" && r.Error == "" && r.Workload == ""
	})
	if len(runs) == 0 || len(sync) == 0 {
		return ""
	}
	accepted := mean(runs, func(r Run) float64 { return float64(*r.Accepted) / r.DurationS })
	created := mean(sync, func(r Run) float64 { return r.OrdersRPS })
	offered := fmt.Sprintf("at %d/s offered", runs[0].Rate)
	if runs[0].Rate >= unpaced {
		offered = fmt.Sprintf("as fast as %d clients allow (unpaced)", runs[0].Workers)
	}
	s := fmt.Sprintf("*The queue's row* ([queue.json](docs/results/queue.json)): %d orders for stock %d %s, means of %d runs; "+
		"202s per second %.2fx the 201s of `%s` in the same lab",
		runs[0].Requests, runs[0].InitialStock, offered, len(runs), accepted/created, sync[0].Name())
	ceiling := filter(ev.Queue, func(r Run) bool { return r.Workload == "ceiling" && r.Error == "" })
	if top := mean(ceiling, func(r Run) float64 { return r.ThroughputRPS }); top > 0 {
		s += fmt.Sprintf(" and %.2f of its ceiling (%.0f answers/s)", accepted/top, top)
	}
	return s + "; the outcome's wait grows with the backlog a customer is behind.\n"
}

// unpaced is the rate the lab's sweep offers (loadtest.SweepRate): as
// fast as the clients allow.
const unpaced = 100000

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
