// Package loadtest is the machinery behind the lab (cmd/lab): it proves on
// real servers which lock and guard combinations oversell, and measures what
// each one costs.
//
// One run, in the order Runner.Run performs it:
//
//	Fleet      N orderd OS processes, one backend and guard for all of them
//	Balancer   an in-process round-robin reverse proxy in front of them
//	ResetStock stock and cache reset through the admin API
//	Attack     vegeta at a fixed rate for a fixed number of requests, each
//	           with its own Idempotency-Key, more requests than stock
//	Scrape     the replicas' lock and guard metrics, before they stop
//	Check      the invariants, read from MySQL directly
//	Report     results.json, results.md and report.html
//
// Every piece has one job and can be used alone: the faults pause
// and kill the Fleet's replicas while an Attack runs, and a sweep is a loop
// over Runner.Run with different Specs.
package loadtest
