package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/oversold-lab/oversold/loadtest"
)

// merge joins the results.json of earlier labs' report folders, in the
// order given, into one report in cfg.out, and prints its tables: labs run
// in parallel lanes, or on several machines, then read as one experiment
// (docs/faults.md is made this way). It runs nothing.
func merge(cfg config, args []string, stdout, stderr io.Writer) error {
	var results []loadtest.Result
	for _, dir := range cfg.merge {
		f, err := os.Open(filepath.Join(dir, loadtest.ResultsJSON))
		if err != nil {
			return fmt.Errorf("merge: %w", err)
		}
		rs, err := loadtest.ReadJSON(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("merge %s: %w", dir, err)
		}
		results = append(results, rs...)
	}
	results, notApplicable := loadtest.SplitApplicable(results) // older results.json still hold them
	rep := loadtest.Report{
		Results:       results,
		Machine:       loadtest.ThisMachine(),
		Command:       strings.TrimSpace("lab " + strings.Join(args, " ")),
		Started:       time.Now(),
		Merged:        cfg.merge,
		NotApplicable: notApplicable,
	}
	if err := loadtest.WriteReport(cfg.out, rep); err != nil {
		return err
	}
	loadtest.WriteTable(stderr, results)
	if slices.ContainsFunc(results, func(r loadtest.Result) bool { return r.Fault != "" }) {
		fmt.Fprintln(stderr)
		loadtest.WriteFaultTable(stderr, results)
	}
	fmt.Fprintf(stderr, "\n%s\nreport: %s\n", rep.Span(), filepath.Join(cfg.out, loadtest.ReportHTML))
	if cfg.json {
		return loadtest.WriteJSON(stdout, results)
	}
	return nil
}
