package controllers

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// MetricsOptions choose the labels of the controller's lock metrics.
type MetricsOptions struct {
	// LockNames adds a "name" label, the DistributedLock's name, to the
	// per-lock series. Off by default: whoever may read the metrics endpoint
	// (one cluster-wide permission) would otherwise learn every tenant's
	// lock names, and a series per lock grows with the number of locks.
	// Without it the series are per namespace, the sum of the per-lock ones,
	// so `sum by (namespace)` of the named series equals them.
	LockNames bool
}

// Metrics are the controller's lock metrics. A nil *Metrics records nothing.
type Metrics struct {
	lockNames   bool
	gauges      *lockGauges
	transitions *prometheus.CounterVec
	release     prometheus.Histogram
}

// NewMetrics creates the metrics and registers them with reg, such as
// controller-runtime's metrics.Registry.
func NewMetrics(reg prometheus.Registerer, opts MetricsOptions) (*Metrics, error) {
	labels := []string{"namespace"}
	if opts.LockNames {
		labels = append(labels, "name")
	}
	m := &Metrics{
		lockNames: opts.LockNames,
		gauges: &lockGauges{
			lockNames: opts.LockNames,
			locks:     map[types.NamespacedName]lockState{},
			held: prometheus.NewDesc("lockwarden_lock_held",
				"DistributedLocks held: 1 per held lock, summed over the namespace unless lock names are on.", labels, nil),
			waiting: prometheus.NewDesc("lockwarden_lock_waiting",
				"Candidate pods waiting for DistributedLocks, summed over the namespace unless lock names are on.", labels, nil),
		},
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockwarden_lock_transitions_total", Help: "Lock transitions, by kind: acquired, released, lost, holder_terminated.",
		}, append(labels, "transition")),
		release: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockwarden_lock_release_after_termination_seconds",
			Help:    "Time from a holder pod's termination, as the API records it (to the second), to the lock's release.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
		}),
	}
	for _, c := range []prometheus.Collector{m.gauges, m.transitions, m.release} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) record(lock *locksv1.DistributedLock, held bool, waiting int) {
	if m == nil {
		return
	}
	m.gauges.mu.Lock()
	defer m.gauges.mu.Unlock()
	m.gauges.locks[types.NamespacedName{Namespace: lock.Namespace, Name: lock.Name}] = lockState{held: held, waiting: waiting}
}

func (m *Metrics) transition(lock *locksv1.DistributedLock, kind string) {
	if m == nil {
		return
	}
	if m.lockNames {
		m.transitions.WithLabelValues(lock.Namespace, lock.Name, kind).Inc()
	} else {
		m.transitions.WithLabelValues(lock.Namespace, kind).Inc()
	}
}

func (m *Metrics) observeRelease(d time.Duration) {
	if m != nil {
		m.release.Observe(max(d, 0).Seconds())
	}
}

// forget drops the gauges of a deleted lock.
func (m *Metrics) forget(nn types.NamespacedName) {
	if m == nil {
		return
	}
	m.gauges.mu.Lock()
	defer m.gauges.mu.Unlock()
	delete(m.gauges.locks, nn)
}

// lockState is what the gauges show of one lock.
type lockState struct {
	held    bool
	waiting int
}

// lockGauges keeps the last state recorded for each lock, and reports it per
// lock or summed per namespace when scraped, so a lock's deletion takes its
// share out of its namespace's sums.
type lockGauges struct {
	lockNames     bool
	held, waiting *prometheus.Desc

	mu    sync.Mutex
	locks map[types.NamespacedName]lockState
}

// Describe implements prometheus.Collector.
func (g *lockGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.held
	ch <- g.waiting
}

// Collect implements prometheus.Collector.
func (g *lockGauges) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	type sums struct{ held, waiting float64 }
	series := map[types.NamespacedName]*sums{}
	for nn, st := range g.locks {
		if !g.lockNames {
			nn.Name = ""
		}
		s := series[nn]
		if s == nil {
			s = &sums{}
			series[nn] = s
		}
		if st.held {
			s.held++
		}
		s.waiting += float64(st.waiting)
	}
	for nn, s := range series {
		labels := []string{nn.Namespace}
		if g.lockNames {
			labels = append(labels, nn.Name)
		}
		ch <- prometheus.MustNewConstMetric(g.held, prometheus.GaugeValue, s.held, labels...)
		ch <- prometheus.MustNewConstMetric(g.waiting, prometheus.GaugeValue, s.waiting, labels...)
	}
}
