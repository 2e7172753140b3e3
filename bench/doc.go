// Package bench holds the lock benchmarks: each oversold lock backend side by
// side with the peer library for the same server, on the same private real
// servers (internal/testbed), in the same run, with the same client settings.
//
//	go test -run '^$' -bench . -benchtime 3s -count 3 ./bench/ | tee bench/bench.out
//	go run ./bench/cmd/benchtable < bench/bench.out > bench/results.md
//
// With -count 3 (make bench) the table gives each ratio as the median of the
// three per-run ratios with their range: on a shared machine one run's ratio
// can move by 2x.
//
// Sub-benchmarks are named Benchmark<Server>/<workload>/<implementation>:
//
//   - uncontended: b.N acquire+release pairs, each on a key of its own, by one
//     contender: the cost of the lock when nobody waits.
//   - hot-1, hot-8, hot-32: that many contenders take turns on one key, each
//     holding it for the same tiny critical section and asking again at once
//     after its release. They report acq/s; the handoff latency from one
//     holder's call to Release to another contender's Acquire returning
//     (handoff-p50-ms, handoff-p99-ms; hot-1 has no other contender); and
//     the wait of one Acquire call (wait-p99-ms). A releaser asking again
//     at once can barge past waiters that sleep between tries: that keeps
//     acq/s high while they starve, which wait-p99-ms shows.
//
// Every contender is a client of its own (connections, session, pool), as if
// it were a replica of its own: that is the case a distributed lock exists
// for. Contenders sharing one client would also measure in-process wake-ups,
// which only some libraries have.
//
// A peer without blocking acquisition waits the way its documentation shows;
// the benchmark prints each implementation's strategy as an "oversold-impl:"
// line, and the formatter (bench/cmd/benchtable) puts it in the table.
//
// With -benchtime 1x (CI) every benchmark runs once and every contender still
// acquires at least once, so the contended paths are exercised in seconds.
package bench
