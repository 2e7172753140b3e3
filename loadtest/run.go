package loadtest

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Servers are the addresses every replica of a run shares.
type Servers struct {
	MySQLDSN      string // the oversold database (go-sql-driver DSN)
	RedisAddr     string // stock cache and the redis lock
	RedlockAddrs  []string
	ZKServers     []string
	EtcdEndpoints []string
}

// Spec is one run of the experiment.
type Spec struct {
	Backend   string // lock backend, or "none"
	Guard     string // none, version, fencing, atomic
	Replicas  int
	Fault     string // a Runner.Faults name, or "" for none
	Stock     int    // initial stock per SKU
	SKUs      int    // hot SKUs, ordered round-robin
	Requests  int
	Rate      int // requests per second
	Workers   int // requests in flight at most
	WorkDelay time.Duration
	LockTTL   time.Duration
	Seed      int64 // seeds Run.Rand, which faults draw their timing from
}

// Name is the run's label, as in Result.Name.
func (s Spec) Name() string { return Result{Backend: s.Backend, Guard: s.Guard, Fault: s.Fault}.Name() }

// Fault disturbs a run while its load is in flight: it may pause, kill or
// restart replicas through run.Fleet, or servers it holds itself. ctx ends
// when the load ends; the fault must have undone what it did (resumed a paused
// replica, say) by the time it returns. Its error is noted in the result.
type Fault func(ctx context.Context, run *Run) error

// Run is what a Fault can act on.
type Run struct {
	Spec  Spec
	Fleet *Fleet     // nil when the Runner has a Target
	Rand  *rand.Rand // seeded from Spec.Seed: a fault's choices repeat with it
}

// Runner runs Specs one after another against the same servers. Each run
// gets fresh replicas and SKUs of its own, so runs never see each other's
// orders, locks or cache entries.
type Runner struct {
	Binary     string // the orderd executable; unused with a Target
	Target     string // a balancer URL in front of replicas already running: none are started
	Servers    Servers
	AdminToken string            // bearer token for PUT /v1/inventory
	DB         *sql.DB           // the checker's connection to Servers.MySQLDSN
	Out        string            // report folder; replica logs go to Out/logs/<run>/
	Faults     map[string]Fault  // by Spec.Fault name
	ID         string            // unique per lab: prefixes SKUs and Idempotency-Keys
	Env        map[string]string // extra OVERSOLD_* settings for every replica

	runs atomic.Int64
}

// requestTimeout bounds one order: above orderd's default lock wait (5s), so
// a lock_timeout comes back as a 503 rather than a client timeout.
const requestTimeout = 15 * time.Second

// Run performs spec: replicas, stock reset, load (and fault), metrics,
// invariants. It always returns a Result: a run that could not be made has
// Error set, and the lab goes on with the next one. progress, if not nil,
// hears the requests done so far.
func (rn *Runner) Run(ctx context.Context, spec Spec, progress func(done int)) Result {
	n := rn.runs.Add(1)
	res := spec.result()
	err := rn.run(ctx, n, spec, &res, progress)
	res.settle(err)
	return res
}

// Failed is the Result of a run that could not be made at all.
func (s Spec) Failed(err error) Result {
	res := s.result()
	res.settle(err)
	return res
}

func (s Spec) result() Result {
	return Result{
		Backend: s.Backend, Guard: s.Guard, Replicas: s.Replicas, Fault: s.Fault,
		Requests: s.Requests, Status: map[string]int{}, SKUs: s.SKUs,
		Rate: s.Rate, Workers: s.Workers, Seed: s.Seed,
		WorkDelay: s.WorkDelay.String(), LockTTL: s.LockTTL.String(),
	}
}

// settle records how the run ended and whether every invariant held.
func (r *Result) settle(err error) {
	if err != nil {
		r.Error = err.Error()
	}
	r.Safe = r.Error == "" && r.Oversold == 0 && r.LostUpdates == 0 && r.LostAcks == 0 && r.Duplicates == 0
}

func (rn *Runner) run(ctx context.Context, n int64, spec Spec, res *Result, progress func(int)) error {
	var fault Fault
	if spec.Fault != "" {
		if fault = rn.Faults[spec.Fault]; fault == nil {
			return fmt.Errorf("unknown fault %q", spec.Fault)
		}
	}
	run := &Run{Spec: spec, Rand: rand.New(rand.NewPCG(uint64(spec.Seed), uint64(n)))}
	base := rn.Target
	closeBalancer := func() {}
	if base == "" {
		lb, err := rn.startFleet(ctx, n, run, res)
		if err != nil {
			return err
		}
		defer rn.stopFleet(ctx, run, res)
		closeBalancer = sync.OnceFunc(func() {
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = lb.Close(closeCtx)
		})
		defer closeBalancer()
		base = lb.URL
	}

	t0 := time.Now()
	skus := make([]string, spec.SKUs)
	for i := range skus {
		skus[i] = fmt.Sprintf("hot-%s-%02d-%d", rn.ID, n, i+1)
		if err := ResetStock(ctx, base, rn.AdminToken, skus[i], spec.Stock); err != nil {
			return err
		}
	}
	res.Phases.Reset = since(t0)

	atk, err := rn.load(ctx, run, fault, AttackSpec{
		Target:    base,
		SKUs:      skus,
		Requests:  spec.Requests,
		Rate:      spec.Rate,
		Workers:   spec.Workers,
		Timeout:   requestTimeout,
		KeyPrefix: fmt.Sprintf("%s-%02d", rn.ID, n),
		Progress:  progress,
	}, res)
	if err != nil {
		return err
	}
	// The balancer goes first: connections it opened and never used would
	// hold a replica's graceful shutdown for seconds.
	closeBalancer()

	if run.Fleet != nil {
		m, err := Scrape(ctx, run.Fleet.URLs())
		if err != nil {
			res.Notes = append(res.Notes, "metrics: "+err.Error())
		}
		res.LockWaitMS, res.LockHoldMS = m.LockWait, m.LockHold
		res.Conflicts, res.LeasesLost = m.Conflicts, m.LeasesLost
		if crashed := run.Fleet.Crashed(); crashed != "" && spec.Fault == "" {
			res.Notes = append(res.Notes, crashed)
		}
		// Stop before checking: a request still inside a replica could
		// otherwise commit after the check.
		rn.stopFleet(ctx, run, res)
	} else {
		res.Notes = append(res.Notes, "replicas not started by the lab: backend, guard and replicas are as given, not verified")
	}

	t0 = time.Now()
	inv, err := Check(ctx, rn.DB, Expect{SKUs: skus, InitialStock: spec.Stock, Acked: atk.OrderIDs})
	res.Phases.Check = since(t0)
	if err != nil {
		return err
	}
	res.InitialStock, res.FinalStock, res.OrderedQuantity = inv.InitialStock, inv.FinalStock, inv.OrderedQuantity
	res.Oversold, res.LostUpdates, res.LostAcks, res.Duplicates = inv.Oversold, inv.LostUpdates, inv.LostAcks, inv.Duplicates
	if len(inv.MissingIDs) > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("acknowledged but not in MySQL: %q", inv.MissingIDs))
	}
	return nil
}

// startFleet starts the run's replicas and a balancer in front of them.
func (rn *Runner) startFleet(ctx context.Context, n int64, run *Run, res *Result) (*Balancer, error) {
	spec := run.Spec
	res.ReplicaLogs = filepath.Join(rn.Out, "logs", fmt.Sprintf("%02d-%s", n, strings.NewReplacer("/", "-", "+", "-").Replace(spec.Name())))
	t0 := time.Now()
	fleet, err := StartFleet(ctx, FleetConfig{
		Binary:   rn.Binary,
		Replicas: spec.Replicas,
		Env:      rn.replicaEnv(spec),
		LogDir:   res.ReplicaLogs,
	})
	res.Phases.Start = since(t0)
	if err != nil {
		return nil, err
	}
	lb, err := NewBalancer(fleet.URLs(), spec.Workers)
	if err != nil {
		rn.stopFleet(ctx, &Run{Fleet: fleet}, res)
		return nil, err
	}
	run.Fleet = fleet
	return lb, nil
}

// stopFleet stops the run's replicas, if they still run, within 10s.
func (rn *Runner) stopFleet(ctx context.Context, run *Run, res *Result) {
	if run.Fleet == nil {
		return
	}
	t0 := time.Now()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := run.Fleet.Stop(stopCtx); err != nil {
		res.Notes = append(res.Notes, "stop: "+err.Error())
	}
	run.Fleet = nil
	res.Phases.Stop = since(t0)
}

// load runs the attack, and the fault alongside it until the attack ends,
// and records what the client saw.
func (rn *Runner) load(ctx context.Context, run *Run, fault Fault, spec AttackSpec, res *Result) (*AttackResult, error) {
	t0 := time.Now()
	limit := loadLimit(spec)
	loadCtx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	faultCtx, endFault := context.WithCancel(loadCtx)
	faultDone := make(chan error, 1)
	if fault != nil {
		go func() { faultDone <- fault(faultCtx, run) }()
	} else {
		faultDone <- nil
	}
	atk, err := Attack(loadCtx, spec)
	endFault()
	if atk != nil && err != nil && loadCtx.Err() != nil && ctx.Err() == nil {
		// Our own limit, not the caller's: what was sent is still checked.
		res.Notes = append(res.Notes, fmt.Sprintf("load cut off after %s: %v", limit, err))
		err = nil
	}
	if ferr := <-faultDone; ferr != nil {
		res.Notes = append(res.Notes, "fault "+run.Spec.Fault+": "+ferr.Error())
	}
	res.Phases.Load = since(t0)
	if atk == nil {
		return nil, err
	}
	res.Status, res.NoResponse = atk.Status, atk.NoResponse
	res.DurationS = round(atk.Duration.Seconds())
	res.ThroughputRPS = round(atk.Throughput)
	if atk.Duration > 0 {
		res.OrdersRPS = round(float64(atk.Status["201"]) / atk.Duration.Seconds())
	}
	res.LatencyMS, res.OverTime = atk.Latency, atk.OverTime
	if atk.FirstError != "" {
		res.Notes = append(res.Notes, fmt.Sprintf("%d requests got no answer, the first: %s", atk.NoResponse, atk.FirstError))
	}
	return atk, err
}

// replicaEnv is orderd's configuration for spec (DESIGN.md's variables).
func (rn *Runner) replicaEnv(spec Spec) map[string]string {
	env := map[string]string{
		"OVERSOLD_LOCK":        spec.Backend,
		"OVERSOLD_GUARD":       spec.Guard,
		"OVERSOLD_LOCK_TTL":    spec.LockTTL.String(),
		"OVERSOLD_WORK_DELAY":  spec.WorkDelay.String(),
		"OVERSOLD_ADMIN_TOKEN": rn.AdminToken,
		"OVERSOLD_MYSQL_DSN":   rn.Servers.MySQLDSN,
	}
	set := func(k, v string) {
		if v != "" {
			env[k] = v
		}
	}
	set("OVERSOLD_REDIS_ADDR", rn.Servers.RedisAddr)
	set("OVERSOLD_REDLOCK_ADDRS", strings.Join(rn.Servers.RedlockAddrs, ","))
	set("OVERSOLD_ZK_SERVERS", strings.Join(rn.Servers.ZKServers, ","))
	set("OVERSOLD_ETCD_ENDPOINTS", strings.Join(rn.Servers.EtcdEndpoints, ","))
	for k, v := range rn.Env {
		env[k] = v
	}
	return env
}

// loadLimit bounds an attack in time as well as in count: four times its
// nominal length, plus one request timeout for the stragglers. A service
// slower than that is cut off, and the run says so.
func loadLimit(spec AttackSpec) time.Duration {
	nominal := time.Duration(float64(spec.Requests) / float64(spec.Rate) * float64(time.Second))
	return 4*nominal + requestTimeout
}

// since is the time since t0 in seconds, rounded for the report.
func since(t0 time.Time) float64 { return round(time.Since(t0).Seconds()) }
