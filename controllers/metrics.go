package controllers

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Metrics are the controller's lock metrics. A nil *Metrics records nothing.
type Metrics struct {
	held        *prometheus.GaugeVec
	waiting     *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	release     prometheus.Histogram
}

// NewMetrics creates the metrics and registers them with reg, such as
// controller-runtime's metrics.Registry.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lockwarden_lock_held", Help: "1 while the DistributedLock is held, else 0.",
		}, []string{"namespace", "name"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lockwarden_lock_waiting", Help: "Candidate pods waiting for the DistributedLock.",
		}, []string{"namespace", "name"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockwarden_lock_transitions_total", Help: "Lock transitions, by kind: acquired, released, lost, holder_terminated.",
		}, []string{"namespace", "name", "transition"}),
		release: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockwarden_lock_release_after_termination_seconds",
			Help:    "Time from a holder pod's termination, as the API records it (to the second), to the lock's release.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
		}),
	}
	for _, c := range []prometheus.Collector{m.held, m.waiting, m.transitions, m.release} {
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
	v := 0.0
	if held {
		v = 1
	}
	m.held.WithLabelValues(lock.Namespace, lock.Name).Set(v)
	m.waiting.WithLabelValues(lock.Namespace, lock.Name).Set(float64(waiting))
}

func (m *Metrics) transition(lock *locksv1.DistributedLock, kind string) {
	if m != nil {
		m.transitions.WithLabelValues(lock.Namespace, lock.Name, kind).Inc()
	}
}

func (m *Metrics) observeRelease(d time.Duration) {
	if m != nil {
		m.release.Observe(max(d, 0).Seconds())
	}
}

// forget drops the gauges of a deleted lock.
func (m *Metrics) forget(nn types.NamespacedName) {
	if m != nil {
		m.held.DeleteLabelValues(nn.Namespace, nn.Name)
		m.waiting.DeleteLabelValues(nn.Namespace, nn.Name)
	}
}
