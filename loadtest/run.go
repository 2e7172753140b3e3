package loadtest

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
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

// clone copies s, lists included, so a fault can change its run's copy.
func (s Servers) clone() Servers {
	s.RedlockAddrs = slices.Clone(s.RedlockAddrs)
	s.ZKServers = slices.Clone(s.ZKServers)
	s.EtcdEndpoints = slices.Clone(s.EtcdEndpoints)
	return s
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
	Seed      int64  // seeds Run.Rand, which faults draw their timing from
	Topology  string // "cluster" when Runner.Servers are clusters; "" for single servers
	// Workload is "" for direct orders, WorkloadReservations for checkouts
	// (Requests of them) on SKUs hot SKUs.
	Workload string
	// Gate is OVERSOLD_GATE: "redis", or "" for none.
	Gate string
	// Accept is OVERSOLD_ACCEPT: "queue" (which needs Gate), or "" for sync.
	Accept string
}

// Name is the run's label, as in Result.Name.
func (s Spec) Name() string {
	return Result{Backend: s.Backend, Guard: s.Guard, Fault: s.Fault, Workload: s.Workload, Gate: s.Gate, Accept: s.Accept}.Name()
}

// Fault disturbs a run. Both steps are optional.
type Fault struct {
	// Prepare runs before the replicas start. It may start servers or proxies
	// of its own, change run.Servers (what every replica is given) and set
	// run.ReplicaEnv[i] (extra settings for replica i only, e.g. its lock
	// server address through a proxy). The returned cleanup runs after the run.
	Prepare func(ctx context.Context, run *Run) (cleanup func(), err error)
	// Inject runs while the load is in flight; ctx ends when the load ends.
	// It must have undone what it did (resumed a paused replica) by the time it returns.
	Inject func(ctx context.Context, run *Run) error
	// Backends lists the lock backends the scenario applies to; nil means all.
	// A run on another backend is reported as not applicable, not as a failure.
	Backends []string
	// Workload is the Spec.Workload the scenario drives: "" for direct
	// orders, WorkloadReservations for checkouts.
	Workload string
}

// WorkloadName names a Spec.Workload as the lab's --workload flag does.
func WorkloadName(w string) string {
	if w == "" {
		return "orders"
	}
	return w
}

// TokenlessBackends have no fencing token safe across replicas: guard
// fencing does not apply to them (orderd refuses the pair at start). Local's
// token counts per process only; redlock has none that is safe (docs/design.md).
var TokenlessBackends = []string{"none", "local", "redlock"}

// Applies reports whether the fault makes sense for backend.
func (f Fault) Applies(backend string) bool {
	return f.Backends == nil || slices.Contains(f.Backends, backend)
}

// Run is what a Fault can act on.
type Run struct {
	Spec    Spec
	Servers Servers // a copy of the Runner's; Prepare may change it for this run
	// ReplicaEnv holds extra settings for replica i only (len = Spec.Replicas);
	// they override the shared ones.
	ReplicaEnv []map[string]string
	Fleet      *Fleet     // nil when the Runner has a Target
	Rand       *rand.Rand // seeded from Spec.Seed: a fault's choices repeat with it

	// Set before Inject runs:
	Target    string   // the balancer's URL
	SKUs      []string // the run's SKUs, stock reset
	KeyPrefix string   // the attack's Idempotency-Keys start with it
	// FaultSKU is a SKU of the fault's own, stock reset like the others
	// but never ordered by the load: orders a fault drives itself go there
	// (the load may have sold the others out). Its invariants are checked
	// too; only their violations are added to the result's counts.
	FaultSKU string

	checkouts *CheckoutResult // the reservations workload's answers
	// The fault's own reservations (AckedHold), on FaultSKU.
	faultHeld, faultConfirmed []string

	mu         sync.Mutex
	events     []FaultEvent
	violations []string
	disrupted  []disruption
	acked      []string
	accepted   []Accepted // the fault's own orders answered 202 (accept queue)
	notes      []string
	fired      bool
	recovered  time.Duration // the longest the fault measured itself
}

// Fired marks that the fault did strike (a replica paused holding a lease,
// a path cut under a holder, a server restarted under a lease) and notes
// what it did, in words. A run whose fault never called Fired is reported
// as "fault did not fire": its invariants say nothing about the fault.
func (r *Run) Fired(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fired = true
	r.events = append(r.events, FaultEvent{At: time.Now(), Text: fmt.Sprintf(format, args...), Fired: true})
}

// Recovered records a recovery time the fault measured itself, on orders
// it drove (the load's answers are measured through Disrupted).
func (r *Run) Recovered(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recovered = max(r.recovered, d)
}

type disruption struct {
	sku string
	at  time.Time
}

// Eventf notes what the fault did, in words and when, for the report.
func (r *Run) Eventf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, FaultEvent{At: time.Now(), Text: fmt.Sprintf(format, args...)})
}

// FaultEvent is one thing a fault did, and when.
type FaultEvent struct {
	At    time.Time
	Text  string
	Fired bool // the moment the fault struck (Run.Fired)
}

// Violatedf notes a property the fault checked itself that did not hold
// (a retried key that did not return its order, say): the run is not safe.
func (r *Run) Violatedf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}

// Disrupted marks the moment the fault took orders on sku ("" for every
// SKU) down. The run's recovery_ms is the longest wait, over these marks, for
// the next order on that SKU decided by the service (a 201, or a 409 once
// the stock is gone): the time until a replica holds the lock again.
func (r *Run) Disrupted(sku string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.disrupted = append(r.disrupted, disruption{sku, at})
}

// Acked adds orders the fault itself placed and saw acknowledged to those
// the invariant check expects in MySQL.
func (r *Run) Acked(ids ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acked = append(r.acked, ids...)
}

// AcceptedQueued adds an order the fault itself placed and saw answered
// 202 (accept queue) to those the queue's drain expects in MySQL.
func (r *Run) AcceptedQueued(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.accepted = append(r.accepted, Accepted{ID: id, At: time.Now()})
}

// Notef adds a note to the run's result: what the fault did that explains
// its figures (what a restart lost, say).
func (r *Run) Notef(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// AckedHold adds a reservation the fault itself held and saw acknowledged
// (confirmed: and saw confirmed) to those the invariant check expects.
func (r *Run) AckedHold(id string, confirmed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.faultHeld, id) {
		r.faultHeld = append(r.faultHeld, id)
	}
	if confirmed && !slices.Contains(r.faultConfirmed, id) {
		r.faultConfirmed = append(r.faultConfirmed, id)
	}
}

// recovery is the longest time from a Disrupted mark to the next decided
// answer on its SKU; ok is false when there was no mark, and unrecovered
// counts marks no answer followed before the load ended.
func (r *Run) recovery(answers []Answer) (worst time.Duration, ok bool, unrecovered int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.disrupted {
		var next time.Time
		for _, a := range answers {
			decided := a.Code == http.StatusCreated || a.Code == http.StatusConflict
			if decided && (d.sku == "" || a.SKU == d.sku) && a.End.After(d.at) && (next.IsZero() || a.End.Before(next)) {
				next = a.End
			}
		}
		if next.IsZero() {
			unrecovered++
			continue
		}
		ok = true
		worst = max(worst, next.Sub(d.at))
	}
	return worst, ok, unrecovered
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
	res.compareHistory()
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
		Rate: s.Rate, Workers: s.Workers, Seed: s.Seed, Topology: s.Topology,
		WorkDelay: s.WorkDelay.String(), LockTTL: s.LockTTL.String(), Workload: s.Workload,
		Gate: s.Gate, Accept: s.Accept,
	}
}

// settle records how the run ended and whether every invariant held.
func (r *Result) settle(err error) {
	if err != nil {
		r.Error = err.Error()
	}
	r.Safe = r.Error == "" && !r.NotApplicable && r.Oversold == 0 && r.LostUpdates == 0 && r.LostAcks == 0 && r.Duplicates == 0 && len(r.Violations) == 0 &&
		zero(r.ReservedLeft) && zero(r.DoubleSettled) && zero(r.StuckHolds) && zero(r.LedgerMismatch) &&
		zero(r.LostAccepted) && zero(r.PendingLeft)
}

func (rn *Runner) run(ctx context.Context, n int64, spec Spec, res *Result, progress func(int)) error {
	var fault Fault
	if spec.Fault != "" {
		var ok bool
		if fault, ok = rn.Faults[spec.Fault]; !ok {
			return fmt.Errorf("unknown fault %q", spec.Fault)
		}
		if !fault.Applies(spec.Backend) {
			res.NotApplicable = true
			res.Notes = append(res.Notes, fmt.Sprintf("fault %s does not apply to backend %s (only %s)", spec.Fault, spec.Backend, strings.Join(fault.Backends, ", ")))
			return nil
		}
	}
	if spec.Guard == "fencing" && slices.Contains(TokenlessBackends, spec.Backend) {
		// Every write would carry token 0 and be refused: a run that sells
		// nothing says nothing about fencing.
		res.NotApplicable = true
		res.Notes = append(res.Notes, fmt.Sprintf("guard fencing does not apply to backend %s: it has no fencing token", spec.Backend))
		return nil
	}
	if spec.Fault != "" && fault.Workload != spec.Workload {
		return fmt.Errorf("fault %s needs the %s workload", spec.Fault, WorkloadName(fault.Workload))
	}
	run := &Run{
		Spec:       spec,
		Servers:    rn.Servers.clone(),
		ReplicaEnv: make([]map[string]string, max(spec.Replicas, 0)),
		Rand:       rand.New(rand.NewPCG(uint64(spec.Seed), uint64(n))),
	}
	if fault.Prepare != nil {
		t0 := time.Now()
		cleanup, err := fault.Prepare(ctx, run)
		res.Phases.Prepare = since(t0)
		if err != nil {
			return fmt.Errorf("fault %s: prepare: %w", spec.Fault, err)
		}
		if cleanup != nil {
			defer cleanup()
		}
	}
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
	if spec.Workload == WorkloadCeiling {
		skus = nil // GET /healthz touches no stock
	}
	for i := range skus {
		skus[i] = fmt.Sprintf("hot-%s-%02d-%d", rn.ID, n, i+1)
		if err := ResetStock(ctx, base, rn.AdminToken, skus[i], spec.Stock); err != nil {
			return err
		}
	}
	if spec.Fault != "" {
		run.FaultSKU = fmt.Sprintf("fault-%s-%02d", rn.ID, n)
		if err := ResetStock(ctx, base, rn.AdminToken, run.FaultSKU, spec.Stock); err != nil {
			return err
		}
	}
	res.Phases.Reset = since(t0)
	keyPrefix := fmt.Sprintf("%s-%02d", rn.ID, n)
	run.Target, run.SKUs, run.KeyPrefix = base, skus, keyPrefix

	// The cluster bus's pub/sub counters, on a Redis Cluster the run's
	// lock uses alone (pubsub.go).
	var busNodes []string
	var bus map[string]busCounts
	if nodes := strings.Split(run.Servers.RedisAddr, ","); spec.Topology == "cluster" && spec.Backend == "redis" && spec.Fault == "" && len(nodes) > 1 {
		var err error
		if bus, err = readBus(ctx, nodes); err != nil {
			res.Notes = append(res.Notes, "pub/sub counters: "+err.Error())
		}
		busNodes = nodes
	}

	var watch func() []queueSample
	if spec.Accept == "queue" {
		watch = rn.watchQueue(ctx, run)
	}
	loadStart := time.Now()
	load := rn.load
	if spec.Workload == WorkloadReservations {
		load = rn.checkoutLoad
	}
	atk, err := load(ctx, run, fault, AttackSpec{
		Target:    base,
		SKUs:      skus,
		Requests:  spec.Requests,
		Rate:      spec.Rate,
		Workers:   spec.Workers,
		Timeout:   requestTimeout,
		KeyPrefix: keyPrefix,
		Path:      ceilingPath(spec),
		Progress:  progress,
	}, res)
	if err != nil {
		if watch != nil {
			watch()
		}
		return err
	}
	// The balancer goes first: connections it opened and never used would
	// hold a replica's graceful shutdown for seconds.
	closeBalancer()
	if spec.Accept == "queue" { // the replicas write the backlog before they stop
		urls := []string{base}
		if run.Fleet != nil {
			urls = run.Fleet.URLs()
		}
		outcomes, err := drainQueue(ctx, rn.DB, urls, atk.Accepted, queueDrainBound, res)
		samples := watch()
		if err != nil {
			return err
		}
		queueTimeline(firstSent(atk.Answers), atk.Accepted, outcomes, samples, res)
		run.mu.Lock()
		own := slices.Clone(run.accepted)
		run.mu.Unlock()
		if err := res.drainFaultQueue(ctx, rn.DB, urls, own); err != nil {
			return err
		}
	}

	var leases []LeaseRecord
	var writes []WriteRecord
	var stopped *Fleet // the lab's replicas, stopped for the check
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
		res.StaleWritesRefused = m.Conflicts
		res.PeakRSSMB, res.ReplicaPeakRSSMB = run.Fleet.PeakRSS()
		// Stop before checking: a request still inside a replica could
		// otherwise commit after the check.
		stopped = run.Fleet
		rn.stopFleet(ctx, run, res)
		leases, writes, err = ReadRecords(res.ReplicaLogs)
		if err != nil {
			res.Notes = append(res.Notes, "lease records: "+err.Error())
		}
		res.Batches = BatchesOf(writes)
		ov := Overlaps(leases)
		res.Leases, res.Overlaps = len(leases), len(ov)
		if bus != nil {
			if res.PubSub, err = measurePubSub(ctx, busNodes, bus, len(leases)); err != nil {
				res.Notes = append(res.Notes, "pub/sub counters: "+err.Error())
			}
		}
		res.HandoffMS = Handoffs(leases)
		for _, o := range ov[:min(len(ov), 3)] {
			res.Notes = append(res.Notes, "two holders: "+o.String())
		}
	} else {
		res.Notes = append(res.Notes, "replicas not started by the lab: backend, guard and replicas are as given, not verified")
	}

	t0 = time.Now()
	run.mu.Lock()
	faultAcked := slices.Clone(run.acked)
	events := slices.Clone(run.events)
	res.Violations = slices.Clone(run.violations)
	res.Notes = append(res.Notes, run.notes...)
	fired, recovered := run.fired, run.recovered
	run.mu.Unlock()
	for _, e := range events {
		res.FaultEvents = append(res.FaultEvents, e.Text)
	}
	if spec.Fault != "" && len(leases) > 0 { // the lab's own replicas logged them
		res.Timeline = BuildTimeline(loadStart, run.FaultSKU, events, leases, writes)
	}
	if spec.Fault != "" && fault.Inject != nil && !fired {
		res.NotFired = true
		res.Notes = append(res.Notes, "fault did not fire: the run says nothing about "+spec.Fault)
	}
	if d, ok, unrecovered := run.recovery(atk.Answers); ok || unrecovered > 0 || recovered > 0 {
		if ok || recovered > 0 {
			ms := round(float64(max(d, recovered)) / float64(time.Millisecond))
			res.RecoveryMS = &ms
		}
		if unrecovered > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%d disruptions with no order decided after them before the load ended", unrecovered))
		}
	}
	if spec.Workload == WorkloadCeiling {
		return nil // no stock, no invariants: only the HTTP path was measured
	}
	if spec.Workload == WorkloadReservations {
		err := rn.checkCheckouts(ctx, run, res)
		res.Phases.Check = since(t0)
		return err
	}
	inv, err := Check(ctx, rn.DB, Expect{SKUs: skus, InitialStock: spec.Stock, Acked: atk.OrderIDs, SoldOut: soldOut(atk.Answers)})
	if err != nil {
		return err
	}
	res.InitialStock, res.FinalStock, res.OrderedQuantity = inv.InitialStock, inv.FinalStock, inv.OrderedQuantity
	if spec.Accept == "" { // a 202 says nothing of the write: the sync model does not apply
		checkHistory(ctx, rn.DB, spec, skus, atk.Answers, res)
	}
	res.Oversold, res.LostUpdates, res.LostAcks, res.Duplicates = inv.Oversold, inv.LostUpdates, inv.LostAcks, inv.Duplicates
	res.Undersold = inv.Undersold
	if spec.Gate != "" && inv.Undersold > 0 {
		if err := rn.settleGate(ctx, run, stopped, soldOut(atk.Answers), res); err != nil {
			res.Notes = append(res.Notes, "the gate's back-check was not watched: "+err.Error())
		}
	}
	if len(inv.MissingIDs) > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("acknowledged but not in MySQL: %q", inv.MissingIDs))
	}
	if run.FaultSKU != "" {
		own, err := Check(ctx, rn.DB, Expect{SKUs: []string{run.FaultSKU}, InitialStock: spec.Stock, Acked: faultAcked})
		if err != nil {
			return err
		}
		res.addFaultSKU(own)
	}
	res.Phases.Check = since(t0)
	return nil
}

// errorCodes counts the 4xx and 5xx answers by status and API error code:
// "503 unavailable", "409 conflict".
func errorCodes(answers []Answer) map[string]int {
	out := map[string]int{}
	for _, a := range answers {
		if a.Code >= 400 {
			out[strconv.Itoa(a.Code)+" "+cmp.Or(a.Error, "(no code)")]++
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// soldOut returns the SKUs on which some order was answered 409
// out_of_stock, in the order first seen.
func soldOut(answers []Answer) []string {
	var out []string
	for _, a := range answers {
		if a.Code == http.StatusConflict && a.Error == "out_of_stock" && !slices.Contains(out, a.SKU) {
			out = append(out, a.SKU)
		}
	}
	return out
}

// addFaultSKU adds the violations found on the fault's own SKU to the
// result's counts.
func (r *Result) addFaultSKU(own Invariants) {
	r.Oversold += own.Oversold
	r.LostUpdates += own.LostUpdates
	r.LostAcks += own.LostAcks
	r.Duplicates += own.Duplicates
	if len(own.MissingIDs) > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("acknowledged to the fault but not in MySQL: %q", own.MissingIDs))
	}
}

// startFleet starts the run's replicas and a balancer in front of them.
func (rn *Runner) startFleet(ctx context.Context, n int64, run *Run, res *Result) (*Balancer, error) {
	spec := run.Spec
	res.ReplicaLogs = filepath.Join(rn.Out, "logs", fmt.Sprintf("%02d-%s", n, strings.NewReplacer("/", "-", "+", "-").Replace(spec.Name())))
	t0 := time.Now()
	fleet, err := StartFleet(ctx, FleetConfig{
		Binary:   rn.Binary,
		Replicas: spec.Replicas,
		Env:      rn.replicaEnv(spec, run.Servers),
		Each:     run.ReplicaEnv,
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
	if fault.Inject != nil {
		go func() { faultDone <- fault.Inject(faultCtx, run) }()
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
	res.ErrorCodes = errorCodes(atk.Answers)
	res.DurationS = round(atk.Duration.Seconds())
	res.ThroughputRPS = round(atk.Throughput)
	if atk.Duration > 0 {
		res.OrdersRPS = round(float64(atk.Status["201"]) / atk.Duration.Seconds())
		if n := atk.Status["202"]; n > 0 {
			res.AcceptedRPS = round(float64(n) / atk.Duration.Seconds())
		}
	}
	res.LatencyMS, res.OverTime = atk.Latency, atk.OverTime
	if atk.FirstError != "" {
		res.Notes = append(res.Notes, fmt.Sprintf("%d requests got no answer, the first: %s", atk.NoResponse, atk.FirstError))
	}
	return atk, err
}

// replicaEnv is orderd's configuration for spec (docs/design.md's variables).
func (rn *Runner) replicaEnv(spec Spec, srv Servers) map[string]string {
	env := map[string]string{
		"OVERSOLD_LOCK":        spec.Backend,
		"OVERSOLD_GUARD":       spec.Guard,
		"OVERSOLD_LOCK_TTL":    spec.LockTTL.String(),
		"OVERSOLD_WORK_DELAY":  spec.WorkDelay.String(),
		"OVERSOLD_ADMIN_TOKEN": rn.AdminToken,
		"OVERSOLD_MYSQL_DSN":   srv.MySQLDSN,
	}
	set := func(k, v string) {
		if v != "" {
			env[k] = v
		}
	}
	set("OVERSOLD_GATE", spec.Gate)
	set("OVERSOLD_ACCEPT", spec.Accept)
	set("OVERSOLD_REDIS_ADDR", srv.RedisAddr)
	set("OVERSOLD_REDLOCK_ADDRS", strings.Join(srv.RedlockAddrs, ","))
	set("OVERSOLD_ZK_SERVERS", strings.Join(srv.ZKServers, ","))
	set("OVERSOLD_ETCD_ENDPOINTS", strings.Join(srv.EtcdEndpoints, ","))
	if spec.Workload == WorkloadReservations {
		env["OVERSOLD_SWEEP_INTERVAL"] = checkoutSweep.String()
	}
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
