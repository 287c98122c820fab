package main

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// statusMetrics exports what the locks' statuses say, read from the
// manager's cache when scraped, for alerts: how many locks are in each
// condition (a Conflict, a holder that has not started, Redis unavailable),
// and how long the oldest pod behind each lock's gate has waited. Only the
// leader exports them, as only the leader writes the statuses, so a
// standby's scrape adds no duplicates. Series are per namespace, or per lock
// with --metrics-lock-names, as the controller's lock metrics are.
type statusMetrics struct {
	reader    client.Reader
	elected   <-chan struct{}
	lockNames bool
	log       logr.Logger
	now       func() time.Time

	conditions, oldestGated *prometheus.Desc
}

func newStatusMetrics(reader client.Reader, elected <-chan struct{}, lockNames bool, log logr.Logger) *statusMetrics {
	labels := []string{"namespace"}
	if lockNames {
		labels = append(labels, "name")
	}
	return &statusMetrics{
		reader: reader, elected: elected, lockNames: lockNames, log: log, now: time.Now,
		conditions: prometheus.NewDesc("lockwarden_lock_conditions",
			"DistributedLocks by condition type, status and reason, as their statuses say (summed over the namespace unless lock names are on).",
			append(slices.Clone(labels), "type", "status", "reason"), nil),
		oldestGated: prometheus.NewDesc("lockwarden_lock_oldest_gated_seconds",
			"Age of the oldest pod still behind a lock's scheduling gate, in line for it or held back (the maximum over the namespace's locks unless lock names are on); 0 when none waits.",
			labels, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *statusMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.conditions
	ch <- m.oldestGated
}

// scrapeTimeout bounds reading the cache during one scrape.
const scrapeTimeout = 5 * time.Second

// Collect implements prometheus.Collector.
func (m *statusMetrics) Collect(ch chan<- prometheus.Metric) {
	select {
	case <-m.elected:
	default:
		return // a standby: the leader exports them
	}
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	var locks locksv1.DistributedLockList
	if err := m.reader.List(ctx, &locks); err != nil {
		m.log.Error(err, "cannot list the locks for the status metrics")
		return
	}
	type condition struct{ series, typ, status, reason string }
	counts := map[condition]float64{}
	oldest := map[string]float64{}
	now := m.now()
	for i := range locks.Items {
		l := &locks.Items[i]
		series := l.Namespace
		if m.lockNames {
			series += "/" + l.Name
		}
		for _, c := range l.Status.Conditions {
			counts[condition{series, c.Type, string(c.Status), c.Reason}]++
		}
		age := m.oldestGatedAge(ctx, l, now)
		if prev, ok := oldest[series]; !ok || age > prev {
			oldest[series] = age
		}
	}
	for c, n := range counts {
		ch <- prometheus.MustNewConstMetric(m.conditions, prometheus.GaugeValue, n, append(m.labels(c.series), c.typ, c.status, c.reason)...)
	}
	for series, age := range oldest {
		ch <- prometheus.MustNewConstMetric(m.oldestGated, prometheus.GaugeValue, age, m.labels(series)...)
	}
}

// oldestGatedAge is the age in seconds of the oldest pod the lock's status
// lists as waiting or blocked that still carries the lock's gate: a pod that
// has not even been scheduled because of it. Candidates that run (the
// standbys of a leader election) wait by design and do not count.
func (m *statusMetrics) oldestGatedAge(ctx context.Context, l *locksv1.DistributedLock, now time.Time) float64 {
	names := slices.Clone(l.Status.Waiting)
	for _, b := range l.Status.Blocked {
		names = append(names, b.PodName)
	}
	gate := locksv1.GateFor(l.Name)
	var age float64
	for _, name := range names {
		var pod corev1.Pod
		if err := m.reader.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: name}, &pod); err != nil {
			continue // gone since the status was written, or not cached
		}
		if !slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == gate }) {
			continue
		}
		age = max(age, now.Sub(pod.CreationTimestamp.Time).Seconds())
	}
	return age
}

// labels splits a series key back into label values.
func (m *statusMetrics) labels(series string) []string {
	if !m.lockNames {
		return []string{series}
	}
	ns, name, _ := strings.Cut(series, "/")
	return []string{ns, name}
}
