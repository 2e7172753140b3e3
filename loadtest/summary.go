package loadtest

import (
	"fmt"
	"slices"
	"strings"
)

// LockFree is the lock-free reference run's name: no lock, the atomic
// guard's conditional decrement.
const LockFree = "none/atomic"

// Summary says in sentences what the results show: what oversold and by
// how much, what held, and the fastest safe configuration against the
// lock-free reference of the same report.
func Summary(results []Result) []string {
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

	// Speed: runs without a fault, where throughput measures the lock.
	var plain []Result
	for _, r := range safe {
		if r.Fault == "" {
			plain = append(plain, r)
		}
	}
	var fastest *Result
	var reference *Result
	for i, r := range plain {
		if r.Name() == LockFree {
			reference = &plain[i]
			continue
		}
		if fastest == nil || r.ThroughputRPS > fastest.ThroughputRPS {
			fastest = &plain[i]
		}
	}
	switch {
	case fastest == nil && len(safe) > 0:
		out = append(out, "No safe run here ran without a fault, so this report compares no speeds: a fault's run measures the fault.")
	case fastest == nil:
	case reference != nil && reference.ThroughputRPS > 0:
		out = append(out, fmt.Sprintf("The fastest safe configuration is %s at %s requests/s, %.2f× the lock-free reference %s (%s requests/s) in this report.",
			fastest.Name(), num(fastest.ThroughputRPS), fastest.ThroughputRPS/reference.ThroughputRPS, LockFree, num(reference.ThroughputRPS)))
	default:
		out = append(out, fmt.Sprintf("The fastest safe configuration is %s at %s requests/s; this report has no lock-free reference (%s) to compare it with.",
			fastest.Name(), num(fastest.ThroughputRPS), LockFree))
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
