// Command results rewrites the generated blocks of README.md and
// docs/results.md from the lab runs in docs/results/ (`make results`).
//
//	go run ./cmd/results                        # rewrite the documents
//	go run ./cmd/results -import faults=DIR,... # take a lab's report folders first
//
// -import copies the runs of the given report folders (the lab's --out)
// into docs/results/NAME.json and records each lab's command, machine and
// wall time, read from its results.md, in docs/results/labs.json.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/oversold-lab/oversold/internal/resultsdoc"
)

func main() {
	root := flag.String("root", ".", "the repository's root")
	imp := flag.String("import", "", "NAME=DIR[,DIR...]: lab report folders to store as docs/results/NAME.json")
	flag.Parse()
	if err := run(*root, *imp); err != nil {
		fmt.Fprintln(os.Stderr, "results:", err)
		os.Exit(1)
	}
}

func run(root, imp string) error {
	if imp != "" {
		if err := resultsdoc.Import(filepath.Join(root, "docs", "results"), imp); err != nil {
			return err
		}
	}
	docs, err := resultsdoc.Generate(root)
	if err != nil {
		return err
	}
	for name, text := range docs {
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}
