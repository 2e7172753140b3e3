package loadtest

import (
	"fmt"
	"slices"
	"strings"
)

// The report explains, where a run appears, what a reader would otherwise
// ask about: the run names, why none/version is slow under a hot SKU and
// what version costs against fencing, and the 503s a fault leaves behind.

// runNames says once how to read a run's name.
const runNames = `Run names are lock/guard, with +gate when the stock gate in Redis ran, +queue when orders were accepted into a queue, and +FAULT for a run under a fault. The lock: local is a mutex inside each replica, shared by none of the others; redis, redlock, zookeeper, mysql and etcd are shared locks; none/version and none/atomic take no lock at all, MySQL's guard alone decides. The guard, in MySQL's write: none trusts the lock alone; version refuses a write if the row changed since it was read, and the order retries; fencing refuses a write whose lock token is older than the last writer's; atomic decrements only if the stock is enough.`

// RunNote explains something about one run, or several.
type RunNote struct {
	Runs []string // the run names it is about
	Text string
}

// RunNotes are the explanations the results table carries below it.
func RunNotes(results []Result) []RunNote {
	out := versionNotes(results)
	for _, r := range results {
		if r.Error != "" || r.Workload != "" {
			continue
		}
		if why := refusals(r); why != "" {
			out = append(out, RunNote{Runs: []string{r.Name()}, Text: r.Name() + ": " + why})
		}
	}
	return out
}

// versionNotes explain none/version's speed under a hot SKU, with its
// figures, and what version costs against fencing under a lock, with the
// figures of one lock run with both guards when the report has them.
func versionNotes(results []Result) []RunNote {
	i := slices.IndexFunc(results, func(r Result) bool {
		return r.Config() == "none/version" && r.Fault == "" && r.Workload == "" && r.Error == ""
	})
	if i < 0 {
		return nil
	}
	v := results[i]
	note := RunNote{Runs: []string{v.Name()}}
	var b strings.Builder
	fmt.Fprintf(&b, "none/version ran at %s requests/s, p50 %s ms, with %d version conflicts: with no lock, every replica reads the hot SKU and races to write it; all but one of each race are refused (the version moved), and the order reads and tries again, with jitter, up to its bound",
		num(v.ThroughputRPS), num(v.LatencyMS.P50), v.Conflicts)
	if n := v.ErrorCodes["409 conflict"]; n > 0 {
		fmt.Fprintf(&b, ", then answers 409 conflict (%d orders here", n)
		if v.FinalStock > 0 {
			fmt.Fprintf(&b, ", %d units left unsold", v.FinalStock)
		}
		b.WriteString(")")
	}
	b.WriteString(". The retries are the cost: each one is a read and a write more, and the latency grows with the replicas racing.")
	note.Text = b.String()
	out := []RunNote{note}
	b.Reset()
	cost := RunNote{}
	b.WriteString("Version against fencing: under a lock, version costs about what fencing costs, since the lock lets one writer at a time and the version check rarely refuses. They differ in what they check: version also refuses a write built on a stale read (a cache entry older than the row) and needs no token; fencing checks only that no newer lock holder wrote, and needs a lock that gives tokens (not local, not redlock).")
	// The same lock with both guards, when this report ran them.
	for _, r := range results {
		if r.Guard != "version" || r.Backend == "none" || r.Fault != "" || r.Workload != "" || r.Error != "" {
			continue
		}
		j := slices.IndexFunc(results, func(f Result) bool {
			return f.Backend == r.Backend && f.Guard == "fencing" && f.Fault == "" && f.Workload == "" && f.Error == ""
		})
		if j < 0 {
			continue
		}
		f := results[j]
		fmt.Fprintf(&b, " Here, under %s: version %s requests/s, p50 %s ms, %d conflicts; fencing %s requests/s, p50 %s ms, %d refused.",
			r.Backend, num(r.ThroughputRPS), num(r.LatencyMS.P50), r.Conflicts, num(f.ThroughputRPS), num(f.LatencyMS.P50), f.Conflicts)
		cost.Runs = append(cost.Runs, r.Name(), f.Name())
		break
	}
	cost.Text = b.String()
	return append(out, cost)
}

// refusals explains r's 503s, and its 409s other than out_of_stock, in
// words; "" when it had none.
func refusals(r Result) string {
	n503 := r.Status["503"]
	if n503 == 0 && r.ErrorCodes["409 lock_lost"] == 0 {
		return ""
	}
	var parts []string
	explained := 0
	for _, code := range []string{"503 unavailable", "503 lock_timeout", "409 lock_lost"} {
		n := r.ErrorCodes[code]
		if n == 0 {
			continue
		}
		if strings.HasPrefix(code, "503") {
			explained += n
		}
		parts = append(parts, fmt.Sprintf("%d %s: %s", n, plural(n, "order answered "+code, "orders answered "+code), refusalWhy(r, code)))
	}
	if rest := n503 - explained; rest > 0 {
		parts = append(parts, fmt.Sprintf("%d %s 503: the service refused for the moment (lock_timeout or unavailable, which this run's results do not say); a client retries after Retry-After, with the same Idempotency-Key", rest, plural(rest, "order answered", "orders answered")))
	}
	return strings.Join(parts, "; ")
}

func refusalWhy(r Result, code string) string {
	switch code {
	case "503 unavailable":
		if r.Fault != "" && (r.Guard == "none" || r.Guard == "fencing") {
			return "a server the replicas need did not answer during the fault. Under guards none and fencing a replica stops selling while the Redis cache is away, since both build on the cached stock (selling without updating it would leave the other replicas a stale entry); version and atomic read MySQL and keep selling. Orders go through again once it is back, and a client retries after Retry-After"
		}
		return "a server the replica needs did not answer, or the replica had its limit of requests in flight (OVERSOLD_MAX_IN_FLIGHT); a client retries after Retry-After"
	case "503 lock_timeout":
		if r.Fault != "" {
			return "the SKU's lock was not granted within the lock wait (OVERSOLD_LOCK_WAIT): during the fault no replica could take it until the stuck holder's lease ran out or the lock server came back; a client retries after Retry-After"
		}
		return "the SKU's lock was not granted within the lock wait (OVERSOLD_LOCK_WAIT): the queue for the hot SKU was longer than that; a client retries after Retry-After"
	case "409 lock_lost":
		return "the replica's lease was lost before its write, so the order was refused rather than written by a holder that no longer holds"
	}
	return ""
}
