package loadtest

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// LockFree is the lock-free reference run's name: no lock, the atomic
// guard's conditional decrement.
const LockFree = "none/atomic"

// Summary says in sentences what the results show: what oversold and by
// how much, what held, and the configuration the evidence picks (Pick).
func Summary(results []Result) []string {
	// A ceiling run orders nothing: it is no configuration, and has no
	// invariant to hold.
	results = slices.DeleteFunc(slices.Clone(results), Result.IsCeiling)
	var out []string
	var broken, safe, ran []Result
	for _, r := range results {
		if r.Error != "" {
			continue
		}
		ran = append(ran, r)
		if r.Safe {
			safe = append(safe, r)
		} else {
			broken = append(broken, r)
		}
	}
	if len(ran) == 0 {
		return []string{"No run completed: see the notes below."}
	}
	if failed := len(results) - len(ran); failed > 0 {
		out = append(out, fmt.Sprintf("%d of %d runs could not be made (see the notes below).", failed, len(results)))
	}

	if len(broken) == 0 {
		out = append(out, fmt.Sprintf("Every invariant held in all %d runs: nothing oversold, no update lost, nothing acknowledged lost.", len(ran)))
	} else {
		var what []string
		for _, r := range broken {
			what = append(what, r.Name()+" "+damage(r))
		}
		out = append(out, fmt.Sprintf("%d of %d runs broke an invariant: %s.", len(broken), len(ran), list(what, 6)))
		var names []string
		for _, r := range safe {
			names = append(names, r.Name())
		}
		if len(safe) > 0 {
			out = append(out, fmt.Sprintf("Every invariant held in the other %d: %s.", len(safe), list(names, 8)))
		}
	}

	var faulted []Result
	overlapped := 0
	for _, r := range ran {
		if r.Fault != "" {
			faulted = append(faulted, r)
			if r.Overlaps > 0 {
				overlapped++
			}
		}
	}
	if len(faulted) > 0 {
		heldAnyway := 0
		for _, r := range faulted {
			if r.Overlaps > 0 && r.Safe {
				heldAnyway++
			}
		}
		out = append(out, fmt.Sprintf("Under faults, two replicas held one lock at once in %d of %d runs; the guard kept every invariant in %d of those %d.",
			overlapped, len(faulted), heldAnyway, overlapped))
	}

	out = append(out, historySummary(ran)...)
	out = append(out, queueSummary(ran)...)

	return append(out, Pick(ran)...)
}

// queueSummary says, for each run with accept queue, what its 202s
// became and how long a customer waited to learn it: a 202 is not a
// sale, and its req/s is not comparable to a 201's without it.
func queueSummary(ran []Result) []string {
	var out []string
	for _, r := range ran {
		if r.Accepted == nil {
			continue
		}
		s := fmt.Sprintf("%s answered %d %s 202 (accepted, written later)", r.Name(), *r.Accepted, plural(*r.Accepted, "order", "orders"))
		if c := r.ConfirmMS; c != nil {
			s += fmt.Sprintf("; each learned its outcome %.0f ms after its 202 at the median, %.0f ms at p99", c.P50, c.P99)
		}
		s += fmt.Sprintf("; %d rejected after their 202, %d lost, %d still pending after the drain.", *r.RejectedAfterAccept, *r.LostAccepted, *r.PendingLeft)
		if r.AcceptedRPS > 0 && r.SettledRPS > 0 {
			s += fmt.Sprintf(" It accepted %s orders/s and MySQL took their outcomes at %s/s", num(r.AcceptedRPS), num(r.SettledRPS))
			if r.StreamLenMax != nil {
				s += fmt.Sprintf("; the stream held at most %d %s", *r.StreamLenMax, plural(int(*r.StreamLenMax), "entry", "entries"))
			}
			s += "."
		}
		out = append(out, s)
	}
	return out
}

// config is one configuration's runs of direct orders in a report.
type config struct {
	name          string
	backend       string
	guard         string
	plain, faults []Result // without and with a fault
}

// configs groups the direct-order runs by configuration (lock/guard), in
// the order they first ran.
func configs(ran []Result) []*config {
	var out []*config
	for _, r := range ran {
		if r.Workload != "" {
			continue // checkouts and the ceiling measure something else
		}
		name := r.Config()
		i := slices.IndexFunc(out, func(c *config) bool { return c.name == name })
		if i < 0 {
			out = append(out, &config{name: name, backend: r.Backend, guard: r.Guard})
			i = len(out) - 1
		}
		if r.Fault == "" {
			out[i].plain = append(out[i].plain, r)
		} else {
			out[i].faults = append(out[i].faults, r)
		}
	}
	return out
}

// safe: every run of runs kept every invariant.
func allSafe(runs []Result) bool {
	return !slices.ContainsFunc(runs, func(r Result) bool { return !r.Safe })
}

// rps is the mean throughput of c's runs without a fault (0: none).
func (c *config) rps() float64 {
	sum := 0.0
	for _, r := range c.plain {
		sum += r.ThroughputRPS
	}
	if len(c.plain) == 0 {
		return 0
	}
	return sum / float64(len(c.plain))
}

// untested returns the fault scenarios of the report that ran on c's
// lock with some guard and never struck c itself.
func (c *config) untested(cs []*config) []string {
	var out []string
	for _, o := range cs {
		if o.backend != c.backend {
			continue
		}
		for _, r := range o.faults {
			struck := slices.ContainsFunc(c.faults, func(f Result) bool { return f.Fault == r.Fault && !f.NotFired })
			if !struck && !slices.Contains(out, r.Fault) {
				out = append(out, r.Fault)
			}
		}
	}
	return out
}

// Pick says which configuration the evidence of this report recommends:
// the fastest one that stayed safe in every fault run of the report, or,
// when the report ran no fault, the fastest guarded one, saying that a run
// without faults proves nothing about a lease lock alone. With faults, a
// candidate must have met, and survived, every scenario the report ran on
// its lock (with any guard). A configuration with guard none is never the
// pick: it trusts the lock alone, which is what a fault breaks. Speed is
// measured by the runs without a fault.
func Pick(ran []Result) []string {
	cs := configs(ran)
	if len(cs) == 0 {
		return nil
	}
	faulted := slices.ContainsFunc(cs, func(c *config) bool { return len(c.faults) > 0 })
	var candidates, partial []*config // partial: safe, but some scenario never struck it
	for _, c := range cs {
		if c.guard == "none" || !allSafe(c.plain) || !allSafe(c.faults) {
			continue
		}
		fired := slices.ContainsFunc(c.faults, func(r Result) bool { return !r.NotFired })
		switch {
		case !faulted:
		case !fired:
			continue // no fault struck it: no evidence
		case len(c.untested(cs)) > 0:
			partial = append(partial, c)
			continue
		}
		candidates = append(candidates, c)
	}
	// Fastest first; those with no run without a fault last, by name.
	slices.SortStableFunc(candidates, func(a, b *config) int { return cmp.Compare(b.rps(), a.rps()) })
	var reference *config
	if i := slices.IndexFunc(cs, func(c *config) bool { return c.name == LockFree && len(c.plain) > 0 && allSafe(c.plain) }); i >= 0 {
		reference = cs[i]
	}
	against := func(c *config) string {
		switch {
		case c.rps() == 0:
			return "; no run without a fault measured its speed"
		case reference == nil || reference.rps() == 0:
			return fmt.Sprintf(" at %s requests/s; this report has no lock-free reference (%s) to compare it with", num(c.rps()), LockFree)
		case reference == c:
			return fmt.Sprintf(" at %s requests/s (the lock-free reference)", num(c.rps()))
		default:
			return fmt.Sprintf(" at %s requests/s, %.2f× the lock-free reference %s (%s requests/s)",
				num(c.rps()), c.rps()/reference.rps(), LockFree, num(reference.rps()))
		}
	}

	var out []string
	if !faulted {
		if len(candidates) == 0 {
			return []string{"No pick: no configuration with a guard ran safely here. No run had a fault, and a run without faults proves nothing about a lease lock alone."}
		}
		best := candidates[0]
		out = append(out, fmt.Sprintf("Pick: %s, the fastest configuration with a guard%s.", best.name, against(best)))
		if best.name == LockFree {
			if i := slices.IndexFunc(candidates, func(c *config) bool { return !strings.HasPrefix(c.name, "none/") }); i >= 0 {
				out = append(out, fmt.Sprintf("The fastest with a lock and a guard: %s%s.", candidates[i].name, against(candidates[i])))
			}
		}
		// A faster run with guard none is what a reader would pick by eye.
		for _, c := range cs {
			if c.guard == "none" && allSafe(c.plain) && c.rps() > best.rps() {
				out = append(out, fmt.Sprintf("%s ran faster (%s requests/s) and nothing oversold, but guard none trusts the lock alone: it is not called safe.", c.name, num(c.rps())))
				break
			}
		}
		return append(out, "No run here had a fault, and a run without faults proves nothing about a lease lock alone: run the lab with --fault to see which configurations survive a paused holder, a restart or a failover.")
	}
	if len(candidates) == 0 {
		return []string{"No pick: no configuration with a guard stayed safe in every fault run of this report (guard none is never picked: it trusts the lock alone)."}
	}
	best := candidates[0]
	var scenarios []string
	for _, r := range best.faults {
		if !slices.Contains(scenarios, r.Fault) {
			scenarios = append(scenarios, r.Fault)
		}
	}
	out = append(out, fmt.Sprintf("Pick: %s, the fastest configuration that stayed safe in every fault run of this report (%d %s: %s)%s.",
		best.name, len(best.faults), plural(len(best.faults), "run", "runs"), strings.Join(scenarios, ", "), against(best)))
	for _, c := range partial {
		if c.rps() > best.rps() {
			out = append(out, fmt.Sprintf("%s ran faster (%s requests/s) and stayed safe where it ran, but %s never struck it here: no evidence.",
				c.name, num(c.rps()), strings.Join(c.untested(cs), ", ")))
		}
	}
	for _, c := range cs {
		if c.guard == "none" && len(c.faults) > 0 && allSafe(c.faults) && allSafe(c.plain) {
			out = append(out, fmt.Sprintf("%s kept every invariant in its fault runs here, but guard none trusts the lock alone, and a fault that outlasts a lease breaks it: it is never the pick.", c.name))
		}
	}
	return out
}

// historySummary counts Porcupine's verdicts on the runs' histories,
// saying how often the check timed out, and names the runs where it and
// the invariant checker disagree (compareHistory says why in their notes).
func historySummary(ran []Result) []string {
	var yes, no, unknown int
	var notLin, lin []string
	for _, r := range ran {
		switch r.Linearizable {
		case Linearizable:
			yes++
			if !r.Safe {
				lin = append(lin, r.Name())
			}
		case NotLinearizable:
			no++
			if r.Oversold == 0 && r.LostUpdates == 0 {
				notLin = append(notLin, r.Name())
			}
		case HistoryUnknown:
			unknown++
		}
	}
	checked := yes + no + unknown
	if checked == 0 {
		return nil
	}
	out := []string{fmt.Sprintf("Porcupine's check of the load's history (at most %s a run): linearizable in %d, not linearizable in %d, unknown (timed out) in %d of %d runs.",
		HistoryTimeout, yes, no, unknown, checked)}
	if len(notLin) > 0 {
		out = append(out, fmt.Sprintf("Not linearizable although nothing was oversold or lost: %s (see their notes).", list(notLin, 6)))
	}
	if len(lin) > 0 {
		out = append(out, fmt.Sprintf("Linearizable although an invariant broke: %s (see their notes).", list(lin, 6)))
	}
	return out
}

// damage says what a run broke, in numbers.
func damage(r Result) string {
	var parts []string
	if r.Oversold > 0 {
		parts = append(parts, fmt.Sprintf("oversold %d (sold %d of %d)", r.Oversold, r.OrderedQuantity, r.InitialStock))
	}
	if r.LostUpdates > 0 {
		parts = append(parts, fmt.Sprintf("lost %d %s", r.LostUpdates, plural(r.LostUpdates, "update", "updates")))
	}
	if r.LostAcks > 0 {
		parts = append(parts, fmt.Sprintf("lost %d acknowledged %s", r.LostAcks, plural(r.LostAcks, "order", "orders")))
	}
	if r.Duplicates > 0 {
		parts = append(parts, fmt.Sprintf("%d duplicated %s", r.Duplicates, plural(r.Duplicates, "key", "keys")))
	}
	if !zero(r.LostAccepted) {
		parts = append(parts, fmt.Sprintf("lost %d accepted %s", *r.LostAccepted, plural(*r.LostAccepted, "order", "orders")))
	}
	if !zero(r.PendingLeft) {
		parts = append(parts, fmt.Sprintf("left %d accepted %s pending", *r.PendingLeft, plural(*r.PendingLeft, "order", "orders")))
	}
	if len(r.Violations) > 0 {
		parts = append(parts, fmt.Sprintf("%d %s", len(r.Violations), plural(len(r.Violations), "violation", "violations")))
	}
	if len(parts) == 0 {
		return r.Verdict()
	}
	return strings.Join(parts, ", ")
}

// list joins names, the first n of them, saying how many more there were.
func list(names []string, n int) string {
	if len(names) > n {
		return strings.Join(names[:n], "; ") + fmt.Sprintf("; and %d more", len(names)-n)
	}
	return strings.Join(names, "; ")
}

// SplitApplicable separates the runs that ran from those whose fault (or
// guard) does not apply to their backend: those are no runs, and leave
// results.json, the tables and the charts (docs/design.md, "The lab").
func SplitApplicable(results []Result) (ran, notApplicable []Result) {
	for _, r := range results {
		if r.NotApplicable {
			notApplicable = append(notApplicable, r)
		} else {
			ran = append(ran, r)
		}
	}
	return ran, notApplicable
}

// NotApplicableLines says once which pairs did not apply, grouped by what
// was not run and why: "redis-failover on zookeeper (guards none,
// fencing): the scenario runs only on redis".
func NotApplicableLines(rs []Result) []string {
	type group struct {
		what, why string
		guards    []string
	}
	var groups []*group
	for _, r := range rs {
		what := r.Backend
		if r.Fault != "" {
			what = r.Fault + " on " + r.Backend
		}
		why := ""
		if len(r.Notes) > 0 {
			why = r.Notes[0]
		}
		i := slices.IndexFunc(groups, func(g *group) bool { return g.what == what && g.why == why })
		if i < 0 {
			groups = append(groups, &group{what: what, why: why})
			i = len(groups) - 1
		}
		if !slices.Contains(groups[i].guards, r.Guard) {
			groups[i].guards = append(groups[i].guards, r.Guard)
		}
	}
	var out []string
	for _, g := range groups {
		line := fmt.Sprintf("%s (%s %s)", g.what, plural(len(g.guards), "guard", "guards"), strings.Join(g.guards, ", "))
		if g.why != "" {
			line += ": " + g.why
		}
		out = append(out, line)
	}
	return out
}
