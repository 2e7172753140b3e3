package order

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/oversold-lab/oversold/storage"
)

// Outcomes of POST /v1/orders, the values of the outcome label: created
// (201), accepted (202, accept queue), replayed (200), the error codes of the API (invalid for
// invalid_request; unavailable is the lock service failing), and error for
// anything unanticipated, such as MySQL or Redis failing mid-request or the
// client leaving.
var outcomes = []string{
	"created", "accepted", "replayed", "out_of_stock", "conflict", "lock_lost",
	"lock_timeout", "unavailable", "invalid", "unknown_sku", "error",
}

// Metrics are one replica's Prometheus series. Each Metrics has a registry
// of its own, so several replicas can live in one process (tests, the lab),
// and every series carries the const label replica (instance belongs to
// Prometheus).
type Metrics struct {
	registry *prometheus.Registry

	orders         *prometheus.CounterVec // by outcome; lock and guard curried
	lockWait       prometheus.Observer
	lockHold       prometheus.Observer
	renewalsFailed prometheus.Counter
	leasesLost     prometheus.Counter
	guardConflicts prometheus.Counter
	cacheBypassed  prometheus.Counter
	batchSize      prometheus.Observer
	refused        prometheus.Counter

	// Reservations (reservations.go, sweeper.go).
	reservations  *prometheus.CounterVec // by op (hold, confirm, cancel, expire) and outcome
	gate          *prometheus.CounterVec // stock gate takes by outcome
	queue         *prometheus.CounterVec // queued orders by outcome
	stockReserved prometheus.Gauge       // stock held by reservations, all SKUs
	sweepLag      prometheus.Gauge       // now - the oldest due hold, by MySQL's clock
}

// NewMetrics registers the series of a replica running lock and guard.
func NewMetrics(replica, lock string, guard storage.Guard) *Metrics {
	reg := prometheus.NewRegistry()
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"replica": replica}, reg)
	wrapped.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := promauto.With(wrapped)

	// 100µs (a local mutex) to 10s (a lock wait past OVERSOLD_LOCK_WAIT).
	buckets := prometheus.ExponentialBucketsRange(100e-6, 10, 16)
	byLock := []string{"lock"}
	m := &Metrics{
		registry: reg,
		orders: f.NewCounterVec(prometheus.CounterOpts{
			Name: "oversold_orders_total",
			Help: "Order requests by outcome.",
		}, []string{"outcome", "lock", "guard"}).MustCurryWith(prometheus.Labels{"lock": lock, "guard": string(guard)}),
		lockWait: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "oversold_lock_wait_seconds",
			Help:    "Time spent waiting for the lock, granted or not.",
			Buckets: buckets,
		}, byLock).WithLabelValues(lock),
		lockHold: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "oversold_lock_hold_seconds",
			Help:    "Time from the lock's grant to its release.",
			Buckets: buckets,
		}, byLock).WithLabelValues(lock),
		renewalsFailed: f.NewCounterVec(prometheus.CounterOpts{
			Name: "oversold_lock_renewals_failed_total",
			Help: "Lease renewals that failed.",
		}, byLock).WithLabelValues(lock),
		leasesLost: f.NewCounterVec(prometheus.CounterOpts{
			Name: "oversold_lock_leases_lost_total",
			Help: "Leases whose Lost channel closed while held.",
		}, byLock).WithLabelValues(lock),
		guardConflicts: f.NewCounterVec(prometheus.CounterOpts{
			Name: "oversold_guard_conflicts_total",
			Help: "Writes the guard refused because another writer came first (version conflicts, stale fences).",
		}, []string{"guard"}).WithLabelValues(string(guard)),
		batchSize: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "oversold_batch_orders",
			Help:    "Orders of one SKU sold under one lease and in one transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 8),
		}),
		cacheBypassed: f.NewCounter(prometheus.CounterOpts{
			Name: "oversold_cache_bypassed_total",
			Help: "Stock reads that went to MySQL because the Redis cache could not be used.",
		}),
		refused: f.NewCounter(prometheus.CounterOpts{
			Name: "oversold_http_refused_total",
			Help: "API requests answered 503 at once because the replica served its OVERSOLD_MAX_IN_FLIGHT already.",
		}),
	}
	m.gate = f.NewCounterVec(prometheus.CounterOpts{
		Name: "oversold_gate_total",
		Help: "Stock gate takes by outcome: taken, short, done, given_back, back_checked.",
	}, []string{"outcome"})
	m.queue = f.NewCounterVec(prometheus.CounterOpts{
		Name: "oversold_queue_total",
		Help: "Queued orders (accept queue) by outcome: accepted, confirmed, rejected, claimed (from a consumer that did not settle them), redelivered (settled in MySQL before).",
	}, []string{"outcome"})
	m.reservations = f.NewCounterVec(prometheus.CounterOpts{
		Name: "oversold_reservations_total",
		Help: "Reservation transitions by operation (hold, confirm, cancel, expire) and outcome.",
	}, []string{"op", "outcome"})
	m.stockReserved = f.NewGauge(prometheus.GaugeOpts{
		Name: "oversold_stock_reserved",
		Help: "Stock held by reservations, all SKUs, as of this replica's last sweep.",
	})
	m.sweepLag = f.NewGauge(prometheus.GaugeOpts{
		Name: "oversold_sweep_lag_seconds",
		Help: "How long the oldest due reservation has waited for the sweeper (0: none due), by MySQL's clock.",
	})
	for _, op := range []string{"hold", "confirm", "cancel", "expire"} {
		m.reservations.WithLabelValues(op, "error") // every op shows, at 0 until it happens
	}
	for _, o := range outcomes {
		m.orders.WithLabelValues(o) // every outcome shows, at 0 until it happens
	}
	return m
}

// RenewalFailed counts a failed lease renewal; it fits
// backends.Config.OnRenewalFailed.
func (m *Metrics) RenewalFailed(key string, err error) { m.renewalsFailed.Inc() }

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}
