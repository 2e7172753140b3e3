// Package resultsdoc writes the figures of README.md and docs/results.md
// from the lab's results.json files in docs/results/, so that no figure in
// them is typed by hand. A document marks each generated block:
//
//	<!-- results:NAME -->
//	... replaced on every run of `make results` ...
//	<!-- /results:NAME -->
//
// It reads the runs by their JSON fields (docs/design.md, "Results"), not
// through loadtest's types, so it depends on the contract only.
package resultsdoc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Run is one lab run, the fields of results.json the documents use.
type Run struct {
	Backend         string         `json:"backend"`
	Guard           string         `json:"guard"`
	Replicas        int            `json:"replicas"`
	Fault           string         `json:"fault"`
	Requests        int            `json:"requests"`
	Workers         int            `json:"workers"`
	Rate            int            `json:"rate"` // requests per second offered
	Status          map[string]int `json:"status"`
	InitialStock    int            `json:"initial_stock"`
	Undersold       int            `json:"undersold"`
	OrderedQuantity int            `json:"ordered_quantity"`
	Oversold        int            `json:"oversold"`
	LostUpdates     int            `json:"lost_updates"`
	LostAcks        int            `json:"lost_acks"`
	Duplicates      int            `json:"duplicates"`
	ThroughputRPS   float64        `json:"throughput_rps"`
	LatencyMS       struct {
		P50 float64 `json:"p50"`
		P99 float64 `json:"p99"`
	} `json:"latency_ms"`
	SKUs          int      `json:"skus"`
	WorkDelay     string   `json:"work_delay"`
	RecoveryMS    *float64 `json:"recovery_ms"`
	OrdersRPS     float64  `json:"orders_rps"`
	Conflicts     int      `json:"guard_conflicts"`
	Safe          bool     `json:"safe"`
	Error         string   `json:"error"`
	Overlaps      int      `json:"overlaps"`
	StaleRefused  int      `json:"stale_writes_refused"`
	NotFired      bool     `json:"fault_not_fired"`
	NotApplicable bool     `json:"not_applicable"`
	Workload      string   `json:"workload"` // "reservations", "ceiling", or "" for orders
	Gate          string   `json:"gate"`     // "redis" for the stock gate
	Accept        string   `json:"accept"`   // "queue": answered 202, written later
	Accepted      *int     `json:"accepted"`
	LostAccepted  *int     `json:"lost_accepted"`
	PendingLeft   *int     `json:"pending_left"`
	ConfirmMS     *struct {
		P50 float64 `json:"p50"`
		P99 float64 `json:"p99"`
	} `json:"confirm_ms"`
	DurationS float64 `json:"duration_s"`
	Batches   struct {
		Writes int `json:"writes"` // transactions that sold orders
		Orders int `json:"orders"`
	} `json:"batches"`
}

// Name is the run's configuration as the lab names it: "redis/version",
// "none/atomic+gate+queue"; a ceiling run is "ceiling".
func (r Run) Name() string {
	if r.Workload == "ceiling" {
		return "ceiling"
	}
	name := r.Backend + "/" + r.Guard
	if r.Gate != "" {
		name += "+gate"
	}
	if r.Accept == "queue" {
		name += "+queue"
	}
	return name
}

// Lab is how one set of runs was made: the lab's command line, its
// machine and its wall time, as the lab's own results.md states them.
type Lab struct {
	Name    string `json:"name"`    // the results file, docs/results/NAME.json
	Command string `json:"command"` // as the lab recorded it
	Machine string `json:"machine"`
	Wall    string `json:"wall"` // the lab's wall time, "2m10s"
}

// Evidence is everything in docs/results/.
type Evidence struct {
	Labs    []Lab
	Default []Run // go run ./cmd/lab
	Sweep   []Run // lab --sweep
	Faults  []Run // lab --fault ...
	// Gate holds the stock gate's labs: a sweep with the HTTP ceiling, a
	// sell-out, and its faults (gate.json).
	Gate []Run
	// Queue holds the order queue's lab (queue.json): sync beside queue.
	Queue []Run
}

// LabsFile lists the labs behind the results files.
const LabsFile = "labs.json"

// Load reads dir's labs.json and the results file of each lab it names.
func Load(dir string) (Evidence, error) {
	var ev Evidence
	b, err := os.ReadFile(filepath.Join(dir, LabsFile))
	if err != nil {
		return ev, err
	}
	if err := json.Unmarshal(b, &ev.Labs); err != nil {
		return ev, fmt.Errorf("%s: %w", LabsFile, err)
	}
	for _, name := range []string{"default", "sweep", "faults", "gate", "queue"} {
		runs, err := readRuns(filepath.Join(dir, name+".json"))
		if err != nil {
			return ev, err
		}
		switch name {
		case "default":
			ev.Default = runs
		case "sweep":
			ev.Sweep = runs
		case "faults":
			ev.Faults = runs
		case "gate":
			ev.Gate = runs
		case "queue":
			ev.Queue = runs
		}
	}
	return ev, nil
}

func readRuns(path string) ([]Run, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var runs []Run
	if err := json.Unmarshal(b, &runs); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var ran []Run
	for _, r := range runs {
		if !r.NotApplicable {
			ran = append(ran, r)
		}
	}
	return ran, nil
}

var block = regexp.MustCompile(`(?s)<!-- results:([a-z-]+) -->\n.*?<!-- /results:([a-z-]+) -->`)

// Rewrite replaces the inside of every marked block of doc with the
// block of that name. A block without a generator, or whose end marker
// names another block, is an error: a figure nobody regenerates.
func Rewrite(doc string, blocks map[string]string) (string, error) {
	var errs []string
	out := block.ReplaceAllStringFunc(doc, func(m string) string {
		sub := block.FindStringSubmatch(m)
		name := sub[1]
		if sub[2] != name {
			errs = append(errs, fmt.Sprintf("block %q ends as %q", name, sub[2]))
			return m
		}
		text, ok := blocks[name]
		if !ok {
			errs = append(errs, fmt.Sprintf("no generator for block %q", name))
			return m
		}
		return "<!-- results:" + name + " -->\n" + strings.TrimRight(text, "\n") + "\n<!-- /results:" + name + " -->"
	})
	if strings.Count(doc, "<!-- results:") != strings.Count(doc, "<!-- /results:") {
		errs = append(errs, "unbalanced results markers")
	}
	if len(errs) > 0 {
		return doc, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return out, nil
}

// Documents are the files the generator rewrites, relative to the
// repository's root.
var Documents = []string{"README.md", "docs/results.md"}

// Generate rewrites the blocks of every document under root from the
// evidence in root/docs/results, and returns each document's new text.
func Generate(root string) (map[string]string, error) {
	ev, err := Load(filepath.Join(root, "docs", "results"))
	if err != nil {
		return nil, err
	}
	blocks := Blocks(ev)
	out := map[string]string{}
	for _, doc := range Documents {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			return nil, err
		}
		text, err := Rewrite(string(b), blocks)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", doc, err)
		}
		out[doc] = text
	}
	return out, nil
}
