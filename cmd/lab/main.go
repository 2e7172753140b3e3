// Command lab runs oversold's experiment and reports what it found: which
// lock and guard combinations oversell across replicas, and what each costs.
//
//	go run ./cmd/lab                      the default experiment
//	go run ./cmd/lab --backends redis,etcd --guards none,fencing
//	go run ./cmd/lab --backends none --guards version,atomic
//	go run ./cmd/lab --json > results.json
//	go run ./cmd/lab --sweep              every backend against the lock-free reference and the HTTP ceiling, replicas 1-4, SKUs 1, 4, 16
//	go run ./cmd/lab --sweep --backends redis --replicas 1,3 --skus 1,16
//	go run ./cmd/lab --merge lane-a,lane-b --out merged   labs run side by side, as one report
//
// For every run it starts fresh orderd replicas (each its own OS process)
// behind an in-process round-robin balancer, resets the run's own SKUs
// through the admin API, sends a fixed number of orders at a fixed rate,
// reads the replicas' lock metrics, stops them, and checks the invariants in
// MySQL. Servers (MariaDB, Redis, three Redis for Redlock, ZooKeeper, etcd)
// are private and started only when a run needs them, unless given:
//
//	--servers 'mysql=root@tcp(127.0.0.1:3306)/oversold,redis=127.0.0.1:6379,redlock=127.0.0.1:7001;127.0.0.1:7002;127.0.0.1:7003,zk=127.0.0.1:2181,etcd=http://127.0.0.1:2379'
//
// Against replicas that already run (the compose demo), --target names their
// balancer, the lab starts nothing, and the admin token comes from
// OVERSOLD_ADMIN_TOKEN:
//
//	OVERSOLD_ADMIN_TOKEN=... go run ./cmd/lab --target http://127.0.0.1:8080 --backends redis --guards version
//
// Progress and the final table go to stderr; results.json, results.md and
// report.html to --out, and sweep.md after a sweep. With --json, stdout
// holds the results array and nothing else. Exit status: 0 when the
// experiment ran, whatever it found; 1 when it could not run; 2 for bad
// flags.
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/oversold-lab/oversold/loadtest"
	"github.com/oversold-lab/oversold/loadtest/faults"
)

// Exit statuses (docs/design.md).
const (
	exitRan         = 0
	exitCouldNotRun = 1
	exitBadFlags    = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole lab; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitRan
	}
	if err != nil {
		fmt.Fprintln(stderr, "lab:", err)
		return exitBadFlags
	}
	if cfg.merge != nil {
		err = merge(cfg, args, stdout, stderr)
	} else {
		err = lab(ctx, cfg, args, stdout, stderr)
	}
	if err != nil {
		fmt.Fprintln(stderr, "lab:", err)
		return exitCouldNotRun
	}
	return exitRan
}

func lab(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	began := time.Now()
	specs := cfg.specs()
	tty := false
	if f, ok := stderr.(*os.File); ok {
		tty = isTerminal(f)
	}

	rn := &loadtest.Runner{
		Target: cfg.target,
		Out:    cfg.out,
		ID:     labID(),
		Faults: faults.All(),
	}
	var fleet *fleetServers
	if cfg.target != "" {
		rn.AdminToken = os.Getenv("OVERSOLD_ADMIN_TOKEN")
		rn.Servers.MySQLDSN = defaultTargetDSN
		if dsn, ok := cfg.servers[kindMySQL]; ok {
			rn.Servers.MySQLDSN = dsn
		}
	} else {
		rn.AdminToken = rand.Text()
		var err error
		if fleet, rn.Binary, err = prepare(ctx, cfg, specs, stderr); err != nil {
			return err
		}
		defer fleet.stop(cfg.keep)
		if cfg.orderd == "" {
			defer os.RemoveAll(filepath.Dir(rn.Binary))
		}
		rn.Servers = fleet.addrs
		if err := os.RemoveAll(filepath.Join(cfg.out, "logs")); err != nil {
			return err
		}
	}
	db, err := sql.Open("mysql", rn.Servers.MySQLDSN)
	if err != nil {
		return fmt.Errorf("mysql: %w", err)
	}
	defer db.Close()
	rn.DB = db

	results := make([]loadtest.Result, 0, len(specs))
	for i, spec := range specs {
		if ctx.Err() != nil {
			break
		}
		label := fmt.Sprintf("[%d/%d] %s", i+1, len(specs), spec.Name())
		if cfg.sweep.on {
			label += sweepLabel(spec)
		}
		p := startProgress(stderr, tty, label, spec.Requests)
		start := time.Now()
		var res loadtest.Result
		if err := fleet.unavailable(spec.Backend); err != nil {
			res = spec.Failed(err)
		} else {
			res = rn.Run(ctx, spec, p.set)
		}
		p.finish(res, time.Since(start))
		results = append(results, res)
	}

	asked := len(results)
	results, notApplicable := loadtest.SplitApplicable(results)
	rep := loadtest.Report{
		Results:       results,
		Machine:       loadtest.ThisMachine(),
		Command:       strings.TrimSpace("lab " + strings.Join(args, " ")),
		Started:       began,
		Wall:          time.Since(began),
		NotApplicable: notApplicable,
	}
	if err := loadtest.WriteReport(cfg.out, rep); err != nil {
		return err
	}
	if cfg.sweep.on {
		if err := reportSweep(cfg.out, rep, stderr); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(stderr)
		loadtest.WriteTable(stderr, results)
		if slices.ContainsFunc(results, func(r loadtest.Result) bool { return r.Workload != "" }) {
			fmt.Fprintln(stderr)
			loadtest.WriteReservationTable(stderr, results)
		}
	}
	if slices.ContainsFunc(results, func(r loadtest.Result) bool { return r.Fault != "" }) {
		fmt.Fprintln(stderr)
		loadtest.WriteFaultTable(stderr, results)
		for _, r := range results {
			if r.Fault != "" {
				fmt.Fprintf(stderr, "  %s (seed %d): %s\n", r.Name(), r.Seed, r.Story())
			}
		}
	}
	for _, l := range loadtest.NotApplicableLines(notApplicable) {
		fmt.Fprintf(stderr, "  not run, does not apply: %s\n", l)
	}
	fmt.Fprintf(stderr, "\n%s, %s wall time\nreport: %s\n", rep.Machine, rep.Wall.Round(time.Second),
		filepath.Join(cfg.out, loadtest.ReportHTML))
	if cfg.keep && fleet != nil {
		fleet.describe(stderr)
	}
	if cfg.json {
		if err := loadtest.WriteJSON(stdout, results); err != nil {
			return err
		}
	}

	if ctx.Err() != nil {
		return fmt.Errorf("interrupted after %d of %d runs", asked, len(specs))
	}
	for _, r := range results {
		if r.Error == "" {
			return nil
		}
	}
	return errors.New("no run could be made: see the errors above")
}

// prepare starts the servers the runs need and builds orderd, both at once.
func prepare(ctx context.Context, cfg config, specs []loadtest.Spec, stderr io.Writer) (*fleetServers, string, error) {
	need := []string{kindMySQL, kindRedis}
	for _, s := range specs {
		if k := kindOf(s.Backend); k != "" && !slices.Contains(need, k) {
			need = append(need, k)
		}
	}
	fmt.Fprintf(stderr, "starting servers (%s, topology %s) and building orderd…\n", strings.Join(need, ", "), cfg.topology)
	start := time.Now()

	var wg sync.WaitGroup
	var fleet *fleetServers
	var srvErr, buildErr error
	binary := cfg.orderd
	wg.Go(func() { fleet, srvErr = startServers(ctx, need, cfg.servers, cfg.topology, cfg.keep) })
	if binary == "" {
		wg.Go(func() { binary, buildErr = buildOrderd(ctx) })
	}
	wg.Wait()
	if err := errors.Join(srvErr, buildErr); err != nil {
		if fleet != nil {
			fleet.stop(cfg.keep)
		}
		if binary != "" && cfg.orderd == "" {
			os.RemoveAll(filepath.Dir(binary))
		}
		return nil, "", err
	}
	for kind, err := range fleet.missing {
		fmt.Fprintf(stderr, "%s unavailable, its runs will fail: %v\n", kind, err)
	}
	fmt.Fprintf(stderr, "ready in %s\n", time.Since(start).Round(100*time.Millisecond))
	return fleet, binary, nil
}

// buildOrderd builds cmd/orderd once for the whole lab, into a temp folder,
// with the lab's fault hook (build tag labfaults: see cmd/orderd).
func buildOrderd(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp("", "oversold-lab-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "orderd")
	out, err := exec.CommandContext(ctx, "go", "build", "-tags", "labfaults", "-o", bin, "github.com/oversold-lab/oversold/cmd/orderd").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("build orderd: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

// labID names this lab's SKUs and Idempotency-Keys apart from any earlier
// lab's on the same database: base-36 milliseconds.
func labID() string {
	return strconv.FormatInt(time.Now().UnixMilli(), 36)
}
