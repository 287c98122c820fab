package redislock

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are Prometheus collectors for lock activity. Create them with
// NewMetrics, pass them in Options.Metrics, and register them yourself:
//
//	m := redislock.NewMetrics()
//	prometheus.MustRegister(m)
//
// A nil *Metrics records nothing.
type Metrics struct {
	acquireLatency  prometheus.Histogram
	waitTime        prometheus.Histogram
	holdTime        prometheus.Histogram
	renewals        prometheus.Counter
	renewalFailures prometheus.Counter
	lostLeases      prometheus.Counter
}

// NewMetrics returns unregistered collectors named redislock_*.
func NewMetrics() *Metrics {
	// From 100µs (a loopback round trip) to about 100s (a long wait or hold).
	buckets := prometheus.ExponentialBuckets(0.0001, 4, 10)
	return &Metrics{
		acquireLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "redislock_acquire_latency_seconds", Help: "Duration of one acquire attempt, a single round trip to Redis.", Buckets: buckets,
		}),
		waitTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "redislock_wait_seconds", Help: "Time from a Lock call to holding the lock.", Buckets: buckets,
		}),
		holdTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "redislock_hold_seconds", Help: "Time from taking a lock to its final Unlock.", Buckets: buckets,
		}),
		renewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redislock_renewals_total", Help: "Successful watchdog renewals.",
		}),
		renewalFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redislock_renewal_failures_total", Help: "Watchdog renewals that got no answer from Redis.",
		}),
		lostLeases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redislock_lost_leases_total", Help: "Held locks whose ownership could no longer be vouched for.",
		}),
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.acquireLatency, m.waitTime, m.holdTime, m.renewals, m.renewalFailures, m.lostLeases}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Metrics) observeAcquire(d time.Duration) {
	if m != nil {
		m.acquireLatency.Observe(d.Seconds())
	}
}

func (m *Metrics) observeWait(d time.Duration) {
	if m != nil {
		m.waitTime.Observe(d.Seconds())
	}
}

func (m *Metrics) observeHold(d time.Duration) {
	if m != nil {
		m.holdTime.Observe(d.Seconds())
	}
}

func (m *Metrics) renewed() {
	if m != nil {
		m.renewals.Inc()
	}
}

func (m *Metrics) renewalFailed() {
	if m != nil {
		m.renewalFailures.Inc()
	}
}

func (m *Metrics) lostLease() {
	if m != nil {
		m.lostLeases.Inc()
	}
}
