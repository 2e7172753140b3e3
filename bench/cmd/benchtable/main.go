// Command benchtable turns the output of the lock benchmarks
// (go test -bench ./bench/) into bench/results.md: the machine the run came
// from, and one table per server comparing our backend with the best peer
// library, every ratio reading "> 1: ours is better". It reads the
// benchmark output on stdin and writes markdown to stdout, and to the file
// named by -o. Output of a failed run is refused (exit status 1), so a
// table never hides a benchmark that broke.
//
// Repeated runs (-count N, or several outputs concatenated) are paired: the
// k-th result of ours with the k-th result of each peer in the same
// workload. With -count N, go test runs each sub-benchmark N times in a
// row (ours N times, then each peer), so a pair is seconds apart, in the
// same workload's block. Each cell is the median over the runs, each ratio the median of the
// per-run ratios with their range: on a shared machine one run's ratio
// can move by 2x.
//
//	go run ./bench/cmd/benchtable -o bench/results.md < bench/bench.out
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Metric units the benchmarks report.
const (
	acqPerSec  = "acq/s"
	handoffP50 = "handoff-p50-ms"
	handoffP99 = "handoff-p99-ms"
	waitP99    = "wait-p99-ms"
	// retake is the share of acquisitions (after the first) that went back
	// to the contender that had just released, in percent.
	retake = "retake-%"
)

const ours = "ours"

// server is one server's results, in the order they appeared.
type server struct {
	name, version string
	waits         [][2]string // implementation, how its waiters wait
	workloads     []string
	impls         []string
	// runs[workload][impl] holds each run's figures by unit, in order.
	runs  map[string]map[string][]map[string]float64
	loads []float64 // the 1-minute load average when each run began
}

// report is everything parsed from one benchmark run.
type report struct {
	config  map[string]string // "oversold-cpu" etc., and Go's "cpu"
	servers []*server
}

func (r *report) server(name string) *server {
	for _, s := range r.servers {
		if s.name == name {
			return s
		}
	}
	s := &server{name: name, runs: map[string]map[string][]map[string]float64{}}
	r.servers = append(r.servers, s)
	return s
}

var (
	// A result line: name, iterations, then value/unit pairs.
	resultLine = regexp.MustCompile(`^(Benchmark\S+)\s+(\d+\s+.*)$`)
	// What is left of a result line after a log line split it: the name
	// alone on one line, the figures at the start of a later one.
	nameOnly  = regexp.MustCompile(`^(Benchmark\S+)\s`)
	figures   = regexp.MustCompile(`^\s*(\d+\s+[-+.eE\d]+ \S+.*)$`)
	procsTail = regexp.MustCompile(`-\d+$`)
	// go test's marks of a failed run (a sub-benchmark's failure may
	// follow the name of the result line it began).
	failed = regexp.MustCompile(`^(.*\s)?--- FAIL|^(FAIL\b|panic: )`)
)

// parse reads benchmark output. Lines it does not know are skipped.
func parse(in io.Reader) (*report, error) {
	r := &report{config: map[string]string{}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	pending := "" // a benchmark name whose figures were pushed to a later line
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if failed.MatchString(line) {
			return nil, fmt.Errorf("the benchmark run failed: %s", line)
		}
		switch {
		case resultLine.MatchString(line):
			m := resultLine.FindStringSubmatch(line)
			if err := r.add(m[1], m[2]); err != nil {
				return nil, err
			}
			pending = ""
		case nameOnly.MatchString(line) || strings.HasPrefix(line, "Benchmark") && !strings.ContainsAny(line, " \t"):
			pending = strings.Fields(line)[0]
		case pending != "" && figures.MatchString(line):
			if err := r.add(pending, figures.FindStringSubmatch(line)[1]); err != nil {
				return nil, err
			}
			pending = ""
		default:
			k, v, ok := strings.Cut(line, ": ")
			if !ok || strings.ContainsAny(k, " \t") {
				continue
			}
			switch k {
			case "oversold-server":
				name, version, _ := strings.Cut(v, " ")
				r.server(name).version = version
			case "oversold-impl":
				f := strings.SplitN(v, " ", 3)
				if len(f) == 3 {
					s := r.server(f[0])
					if w := [2]string{f[1], f[2]}; !slices.Contains(s.waits, w) {
						s.waits = append(s.waits, w)
					}
				}
			case "oversold-load":
				name, load, _ := strings.Cut(v, " ")
				if x, err := strconv.ParseFloat(load, 64); err == nil {
					s := r.server(name)
					s.loads = append(s.loads, x)
				}
			default:
				if _, seen := r.config[k]; !seen { // the first run's
					r.config[k] = v
				}
			}
		}
	}
	return r, sc.Err()
}

// add records one result: name is Benchmark<Server>/<workload>/<impl>-<procs>.
func (r *report) add(name, rest string) error {
	parts := strings.Split(procsTail.ReplaceAllString(strings.TrimPrefix(name, "Benchmark"), ""), "/")
	if len(parts) != 3 {
		return nil // not one of ours
	}
	f := strings.Fields(rest)
	if len(f) < 1 || len(f)%2 != 1 {
		return fmt.Errorf("%s: malformed figures %q", name, rest)
	}
	metrics := map[string]float64{}
	for i := 1; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return fmt.Errorf("%s: %q: %v", name, f[i], err)
		}
		metrics[f[i+1]] = v
	}
	s := r.server(strings.ToLower(parts[0]))
	w, im := parts[1], parts[2]
	if s.runs[w] == nil {
		s.runs[w] = map[string][]map[string]float64{}
		s.workloads = append(s.workloads, w)
	}
	if !slices.Contains(s.impls, im) {
		s.impls = append(s.impls, im)
	}
	s.runs[w][im] = append(s.runs[w][im], metrics)
	return nil
}

// value is the median over the runs of im's unit in workload w.
func (s *server) value(w, im, unit string) (float64, bool) {
	var xs []float64
	for _, m := range s.runs[w][im] {
		if x, ok := m[unit]; ok {
			xs = append(xs, x)
		}
	}
	if len(xs) == 0 {
		return 0, false
	}
	return median(xs), true
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// best returns the best peer's value for unit in workload w, and its name:
// the highest when higher is better, else the lowest. ok is false when no
// peer reported the unit.
func (s *server) best(w, unit string, higher bool) (name string, v float64, ok bool) {
	for _, im := range s.impls {
		if im == ours {
			continue
		}
		x, found := s.value(w, im, unit)
		if !found {
			continue
		}
		if !ok || higher && x > v || !higher && x < v {
			name, v, ok = im, x, true
		}
	}
	return name, v, ok
}

// ratio compares ours with the best peer so that > 1 means ours is better:
// ours÷peer for throughput, peer÷ours for latency.
func ratio(oursV, peerV float64, higher bool) (float64, bool) {
	if higher {
		if peerV <= 0 {
			return 0, false
		}
		return oursV / peerV, true
	}
	if oursV <= 0 {
		return 0, false
	}
	return peerV / oursV, true
}

// ratios are ours against the best peer of the same run, run by run: the
// k-th results of each implementation in a workload.
func (s *server) ratios(w, unit string, higher bool) []float64 {
	var xs []float64
	for k, o := range s.runs[w][ours] {
		ov, ok := o[unit]
		if !ok {
			continue
		}
		var best float64
		found := false
		for _, im := range s.impls {
			if im == ours || k >= len(s.runs[w][im]) {
				continue
			}
			x, ok := s.runs[w][im][k][unit]
			if ok && (!found || higher && x > best || !higher && x < best) {
				best, found = x, true
			}
		}
		if !found {
			continue
		}
		if x, ok := ratio(ov, best, higher); ok {
			xs = append(xs, x)
		}
	}
	return xs
}

// comparison is one cell triple of the summary: ours, best peer (medians
// over the runs), and the median of the per-run ratios with their range.
func (s *server) comparison(w, unit string, higher bool) []string {
	o, haveOurs := s.value(w, ours, unit)
	name, p, havePeer := s.best(w, unit, higher)
	cells := []string{"—", "—", "—"}
	if haveOurs {
		cells[0] = num(o)
	}
	if havePeer {
		cells[1] = num(p) + " " + name
	}
	if xs := s.ratios(w, unit, higher); len(xs) > 0 {
		cells[2] = fmt.Sprintf("%.2f", median(xs))
		if len(xs) > 1 {
			cells[2] += fmt.Sprintf(" (%.2f-%.2f)", slices.Min(xs), slices.Max(xs))
		}
	}
	return cells
}

// runCount is how many runs the report holds: the most results any
// implementation has in any workload.
func (r *report) runCount() int {
	n := 0
	for _, s := range r.servers {
		for _, byImpl := range s.runs {
			for _, runs := range byImpl {
				n = max(n, len(runs))
			}
		}
	}
	return n
}

// num keeps about three significant digits.
func num(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
}

func row(w io.Writer, cells ...string) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
}

// write renders the report as markdown.
func (r *report) write(w io.Writer) {
	c := func(k string) string {
		if v := r.config[k]; v != "" {
			return v
		}
		return "unknown"
	}
	cpu := r.config["oversold-cpu"]
	if cpu == "" {
		cpu = c("cpu")
	}
	fmt.Fprintf(w, "# Lock benchmarks\n\n")
	fmt.Fprintf(w, "Machine: %s, %s cores, %s, %s. Run: %s, -benchtime %s.\n\n",
		cpu, c("oversold-cores"), c("oversold-kernel"), c("oversold-go"), c("oversold-date"), c("oversold-benchtime"))
	if v := r.config["oversold-setup"]; v != "" {
		fmt.Fprintf(w, "Setup: %s.\n\n", v)
	}
	if n := r.runCount(); n > 1 {
		fmt.Fprintf(w, "Runs: %d. Every figure is the median over the runs; every ratio is the median of the %d per-run ratios "+
			"(the k-th run of ours against the best peer's k-th run: go test -count runs ours %d times in a row, then each peer), with their range.\n\n", n, n, n)
	}
	fmt.Fprintf(w, "Every ratio reads > 1 when ours is better: acq/s is ours ÷ best peer, "+
		"handoff (one holder's Release called to another contender's Acquire returned) is best peer ÷ ours. "+
		"acq/s counts a releaser taking the lock straight back, which sleep-and-retry waiters let it do: "+
		"retake %% is the share of acquisitions that went to the contender that had just released (a fair queue hands each release to another; "+
		"100 at hot-1), and wait p99 (one Acquire call) shows what barging costs the waiters.\n")
	for _, s := range r.servers {
		if len(s.workloads) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n## %s (%s)\n\n", s.name, s.version)
		if len(s.loads) > 0 {
			fmt.Fprintf(w, "Load average (1 min) when this server's benchmarks began (each invocation): %s.\n\n", loads(s.loads))
		}
		for _, wt := range s.waits {
			fmt.Fprintf(w, "- %s: %s\n", wt[0], wt[1])
		}
		fmt.Fprintln(w)
		row(w, "workload", "acq/s ours", "best peer", "ratio", "handoff p50 ms ours", "best peer", "ratio", "handoff p99 ms ours", "best peer", "ratio")
		row(w, "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:")
		for _, wl := range s.workloads {
			cells := []string{wl}
			cells = append(cells, s.comparison(wl, acqPerSec, true)...)
			cells = append(cells, s.comparison(wl, handoffP50, false)...)
			cells = append(cells, s.comparison(wl, handoffP99, false)...)
			row(w, cells...)
		}
		fmt.Fprintln(w)
		row(w, "workload", "implementation", "acq/s", "handoff p50 ms", "handoff p99 ms", "wait p99 ms", "retake %")
		row(w, "---", "---", "---:", "---:", "---:", "---:", "---:")
		for _, wl := range s.workloads {
			for _, im := range s.impls {
				if len(s.runs[wl][im]) == 0 {
					continue
				}
				cells := []string{wl, im}
				for _, u := range []string{acqPerSec, handoffP50, handoffP99, waitP99, retake} {
					if v, ok := s.value(wl, im, u); ok && u == retake {
						cells = append(cells, strconv.FormatFloat(v, 'f', 0, 64))
					} else if ok {
						cells = append(cells, num(v))
					} else {
						cells = append(cells, "—")
					}
				}
				row(w, cells...)
			}
		}
	}
}

func loads(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', 1, 64)
	}
	return strings.Join(parts, ", ")
}

func main() {
	out := flag.String("o", "", "also write the tables to this file")
	flag.Parse()
	if err := run(os.Stdin, os.Stdout, *out); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, stdout io.Writer, out string) error {
	r, err := parse(in)
	if err != nil {
		return err
	}
	if len(r.servers) == 0 {
		return errors.New("no benchmark results on stdin")
	}
	var b strings.Builder
	r.write(&b)
	if out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	_, err = io.WriteString(stdout, b.String())
	return err
}
