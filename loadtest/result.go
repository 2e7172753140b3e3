package loadtest

import (
	"fmt"
	"strings"
)

// Result is one run of the lab: what was asked, what the client saw, what
// MySQL holds afterwards. Its JSON is the run schema of docs/design.md; the fields
// after LatencyMS are additions, never renames.
type Result struct {
	Backend         string         `json:"backend"`
	Guard           string         `json:"guard"`
	Replicas        int            `json:"replicas"`
	Fault           string         `json:"fault"`
	Requests        int            `json:"requests"`
	Status          map[string]int `json:"status"` // HTTP status code -> answers
	InitialStock    int            `json:"initial_stock"`
	FinalStock      int            `json:"final_stock"`
	OrderedQuantity int            `json:"ordered_quantity"`
	Oversold        int            `json:"oversold"`
	LostUpdates     int            `json:"lost_updates"`
	LostAcks        int            `json:"lost_acks"`
	Duplicates      int            `json:"duplicates"`
	ThroughputRPS   float64        `json:"throughput_rps"`
	LatencyMS       Latency        `json:"latency_ms"`

	// Additions.

	// Undersold is the stock MySQL still holds at the end on the SKUs where
	// some order was refused out_of_stock: customers turned away while
	// there was stock to sell (0 when nothing was refused).
	Undersold int `json:"undersold"`
	// UndersoldSettled is, in a gated run that undersold, the stock the
	// gate still withheld from MySQL's once its back-check's bound had
	// passed (0: every pre-deduction of an order that never committed was
	// given back); SettledMS is how long after the load that took.
	UndersoldSettled *int     `json:"undersold_settled,omitempty"`
	SettledMS        *float64 `json:"settled_ms,omitempty"`
	// ErrorCodes counts the refused answers by status and API error code,
	// "409 out_of_stock", "503 unavailable": what the report explains.
	ErrorCodes map[string]int `json:"error_codes,omitempty"`

	SKUs      int    `json:"skus"`
	Rate      int    `json:"rate"`    // requests per second offered
	Workers   int    `json:"workers"` // concurrent client connections at most
	WorkDelay string `json:"work_delay"`
	LockTTL   string `json:"lock_ttl"`
	Seed      int64  `json:"seed"`
	Topology  string `json:"topology,omitempty"` // "cluster" when the lock and cache servers were clusters
	// Linearizable is Porcupine's verdict on the load's history (history.go):
	// "linearizable", "not linearizable", or "unknown" when the check ran
	// out of time; HistoryOps operations checked in HistoryCheckMS.
	Linearizable string `json:"linearizable,omitempty"`
	// HandoffMS: a lock passing between replicas, from one lease's end to
	// the next grant (Handoffs).
	HandoffMS      *Wait    `json:"handoff_ms,omitempty"`
	HistoryOps     int      `json:"history_ops,omitempty"`
	HistoryCheckMS float64  `json:"history_check_ms,omitempty"`
	NoResponse     int      `json:"no_response"` // requests that got no HTTP answer (timeout, refused)
	DurationS      float64  `json:"duration_s"`  // first request sent to last answer received
	OrdersRPS      float64  `json:"orders_rps"`  // 201s per second over the same span
	LockWaitMS     *Wait    `json:"lock_wait_ms,omitempty"`
	LockHoldMS     *Wait    `json:"lock_hold_ms,omitempty"`
	Conflicts      int      `json:"guard_conflicts"`
	LeasesLost     int      `json:"leases_lost"`
	Safe           bool     `json:"safe"`            // ran, and every invariant held
	Error          string   `json:"error,omitempty"` // the run could not be made
	Notes          []string `json:"notes,omitempty"` // what else the lab saw: crashes, transport errors, lost ids
	Phases         Phases   `json:"phases_s"`
	OverTime       []Slice  `json:"latency_over_time,omitempty"`
	ReplicaLogs    string   `json:"replica_logs,omitempty"` // folder of the replicas' stderr
	// Batches: the committed writes and the orders in each (coalescing).
	Batches *Batches `json:"batches,omitempty"`

	// Fault runs.

	// NotApplicable: the fault does not apply to this backend; nothing ran.
	NotApplicable bool `json:"not_applicable,omitempty"`
	// Overlaps counts pairs of leases on one key held by two replicas at once,
	// from the replicas' lease records.
	Overlaps int `json:"overlaps"`
	// Leases is how many lease records the replicas logged.
	Leases int `json:"leases"`
	// StaleWritesRefused is the writes MySQL's guard refused (version conflicts
	// and stale fences): the replicas' oversold_guard_conflicts_total.
	StaleWritesRefused int `json:"stale_writes_refused"`
	// RecoveryMS is how long the service took to take orders again after the
	// fault, where the scenario measures it.
	RecoveryMS *float64 `json:"recovery_ms,omitempty"`
	// FaultEvents says in words what the fault did, in order.
	FaultEvents []string `json:"fault_events,omitempty"`
	// Violations are properties the fault checked itself that did not hold;
	// any makes the run unsafe.
	Violations []string `json:"violations,omitempty"`
	// Timeline is what the lease timeline of the report draws: the
	// contested lock's leases and writes around the fault's window.
	Timeline *Timeline `json:"timeline,omitempty"`
	// NotFired: the run had a fault that never struck (the load ended
	// first, say): its invariants say nothing about the fault.
	NotFired bool `json:"fault_not_fired,omitempty"`

	// The reservations workload (loadtest/reservations.go).

	Workload string `json:"workload,omitempty"` // "reservations", "ceiling"; absent for direct orders
	// ReservedLeft is the stock still reserved once every hold has ended.
	ReservedLeft *int `json:"reserved_left,omitempty"`
	// DoubleSettled counts reservations settled twice (confirmed and given
	// back, or more orders than lines).
	DoubleSettled *int `json:"double_settled,omitempty"`
	// StuckHolds counts holds held past expiry + sweep interval + grace.
	StuckHolds *int `json:"stuck_holds,omitempty"`
	// LedgerMismatch is the stock, reserved and sold quantity the stock
	// ledger (reservation_moves) does not explain (ReservationInvariants).
	LedgerMismatch *int `json:"ledger_mismatch,omitempty"`
	// Checkouts counts the clients' outcomes ("hold 201", "confirm 200",
	// "abandoned", ...); ReservationTimeline the transitions over time.
	Checkouts           map[string]int     `json:"checkouts,omitempty"`
	ReservationTimeline []ReservationSlice `json:"reservation_timeline,omitempty"`

	// PubSub is what the Redis Cluster's bus carried per node, on a
	// cluster run of the redis lock without a fault (pubsub.go).
	PubSub *PubSub `json:"pubsub,omitempty"`

	// Memory.

	// PeakRSSMB is the largest peak resident set size (VmHWM) of the run's
	// replicas, in MiB, read just before they stop; 0 where unknown.
	PeakRSSMB float64 `json:"peak_rss_mb,omitempty"`
	// ReplicaPeakRSSMB is each replica's, by name (a replica restarted
	// by a fault reports its last process only).
	ReplicaPeakRSSMB map[string]float64 `json:"replica_peak_rss_mb,omitempty"`

	// Gate is the replicas' OVERSOLD_GATE: "redis", or "" for none.
	Gate string `json:"gate,omitempty"`

	// Accept is the replicas' OVERSOLD_ACCEPT: "queue", or "" for sync.
	// Queue runs also carry what became of their 202s once the run has
	// drained (queue.go): Accepted (202s), RejectedAfterAccept, LostAccepted
	// (202s whose order MySQL holds neither confirmed nor rejected, and that
	// no replica shows pending), PendingLeft (still pending after the drain
	// bound) and ConfirmMS (from the 202 to the order's final status).
	Accept              string `json:"accept,omitempty"`
	Accepted            *int   `json:"accepted,omitempty"`
	RejectedAfterAccept *int   `json:"rejected_after_accept,omitempty"`
	LostAccepted        *int   `json:"lost_accepted,omitempty"`
	PendingLeft         *int   `json:"pending_left,omitempty"`
	ConfirmMS           *Wait  `json:"confirm_ms,omitempty"`
	// AcceptedRPS is 202s per second over DurationS: what a queue run is
	// compared by (OrdersRPS counts 201s, none here). SettledRPS is the
	// outcomes MySQL took (confirmed and rejected) per second, from the
	// first request sent to the last outcome: below AcceptedRPS when the
	// consumers fell behind.
	AcceptedRPS float64 `json:"accepted_rps,omitempty"`
	SettledRPS  float64 `json:"settled_rps,omitempty"`
	// QueueTimeline is the backlog over time (queue_timeline.go);
	// StreamLenMax the stream's longest sampled length (XLEN), and
	// ReplicaRSSStartMB and ReplicaRSSEndMB each replica's resident memory
	// (VmRSS, MiB) at the first sample, before the load, and the last,
	// once drained.
	QueueTimeline     []QueueSlice       `json:"queue_timeline,omitempty"`
	StreamLenMax      *int64             `json:"stream_len_max,omitempty"`
	ReplicaRSSStartMB map[string]float64 `json:"replica_rss_start_mb,omitempty"`
	ReplicaRSSEndMB   map[string]float64 `json:"replica_rss_end_mb,omitempty"`
}

// Phases is how long each step of a run took, in seconds of wall time.
type Phases struct {
	Start   float64 `json:"start"`             // replicas started and ready
	Reset   float64 `json:"reset"`             // stock and cache reset
	Load    float64 `json:"load"`              // the attack (and fault)
	Stop    float64 `json:"stop"`              // replicas stopped (metrics scraped before)
	Check   float64 `json:"check"`             // invariants read from MySQL
	Prepare float64 `json:"prepare,omitempty"` // the fault's own servers and proxies
}

// Latency holds client-side latency percentiles in milliseconds over every
// answered request, whatever its status.
type Latency struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Wait summarises a replica-side histogram (lock wait or hold) in
// milliseconds, merged over all replicas. P50 and P99 are interpolated within
// histogram buckets, as Prometheus' histogram_quantile does.
type Wait struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P99   float64 `json:"p99"`
}

// Slice is one time slice of an attack, by the time requests were sent.
type Slice struct {
	At       float64 `json:"t_s"` // slice start, seconds after the first request
	Requests int     `json:"requests"`
	Created  int     `json:"created"` // of which answered 201
	P50      float64 `json:"p50"`
	P99      float64 `json:"p99"`
}

// Name is the run's label: "redis/none", "none/atomic", with the fault if
// any, else with the workload if not orders ("redis/none+reservations").
func (r Result) Name() string {
	if r.IsCeiling() {
		return CeilingName
	}
	name := r.Backend + "/" + r.Guard
	if r.Gate != "" {
		name += "+gate"
	}
	if r.Accept != "" {
		name += "+" + r.Accept
	}
	switch {
	case r.Fault != "":
		name += "+" + r.Fault // the reservations' faults say their workload
	case r.Workload != "":
		name += "+" + r.Workload
	}
	return name
}

// Config is the run's configuration, what a team would choose:
// "redis/fencing" or "none/atomic+gate", without the fault or the workload.
func (r Result) Config() string {
	name := r.Backend + "/" + r.Guard
	if r.Gate != "" {
		name += "+gate"
	}
	if r.Accept != "" {
		name += "+" + r.Accept
	}
	return name
}

// Verdict says in words what the invariants found.
func (r Result) Verdict() string {
	if r.Error != "" {
		return "FAILED: " + firstLine(r.Error)
	}
	if r.NotApplicable {
		return "not applicable"
	}
	if r.IsCeiling() {
		return "ceiling: no stock, nothing to break"
	}
	var bad []string
	if r.Oversold > 0 {
		bad = append(bad, fmt.Sprintf("OVERSOLD %d", r.Oversold))
	}
	if r.LostUpdates > 0 {
		bad = append(bad, fmt.Sprintf("%d LOST UPDATES", r.LostUpdates))
	}
	if r.LostAcks > 0 {
		bad = append(bad, fmt.Sprintf("%d LOST ACKS", r.LostAcks))
	}
	if r.Duplicates > 0 {
		bad = append(bad, fmt.Sprintf("%d DUPLICATES", r.Duplicates))
	}
	if !zero(r.LostAccepted) {
		bad = append(bad, fmt.Sprintf("%d LOST ACCEPTED", *r.LostAccepted))
	}
	if !zero(r.PendingLeft) {
		bad = append(bad, fmt.Sprintf("%d PENDING LEFT", *r.PendingLeft))
	}
	for _, v := range r.Violations {
		bad = append(bad, "VIOLATED: "+v)
	}
	if len(bad) == 0 {
		return "safe"
	}
	return strings.Join(bad, ", ")
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
