// Command checkresults reads a lab's results.json on stdin and exits 1
// unless there is at least one run and every run ran and kept every
// invariant (make compose-demo checks the lab service's runs with it).
package main

import (
	"fmt"
	"os"

	"github.com/oversold-lab/oversold/loadtest"
)

func main() {
	results, err := loadtest.ReadJSON(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "checkresults:", err)
		os.Exit(1)
	}
	if len(results) == 0 {
		fmt.Fprintln(os.Stderr, "checkresults: no runs")
		os.Exit(1)
	}
	ok := true
	for _, r := range results {
		fmt.Printf("%s: %d requests, status %v, sold %d of %d, final stock %d, oversold %d, lost updates %d, lost acks %d, duplicates %d: %s\n",
			r.Name(), r.Requests, r.Status, r.OrderedQuantity, r.InitialStock, r.FinalStock,
			r.Oversold, r.LostUpdates, r.LostAcks, r.Duplicates, r.Verdict())
		ok = ok && r.Safe && r.Error == ""
	}
	if !ok {
		os.Exit(1)
	}
}
