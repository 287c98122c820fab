package controllers

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Without lock names the gauges are the per-lock values summed per
// namespace, so the two label sets tell the same story, and a deleted lock
// leaves its namespace's sums.
func TestMetricsLabels(t *testing.T) {
	lock := func(ns, name string) *locksv1.DistributedLock {
		l := &locksv1.DistributedLock{}
		l.Namespace, l.Name = ns, name
		return l
	}
	for _, lockNames := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		m, err := NewMetrics(reg, MetricsOptions{LockNames: lockNames})
		if err != nil {
			t.Fatal(err)
		}
		m.record(lock("a", "x"), true, 2)
		m.record(lock("a", "y"), false, 3)
		m.record(lock("a", "y"), true, 1) // replaces y's earlier state
		m.record(lock("b", "z"), false, 0)
		m.transition(lock("a", "x"), "acquired")
		m.forget(types.NamespacedName{Namespace: "b", Name: "gone"}) // never recorded: no effect

		want := map[string]float64{
			`lockwarden_lock_held{namespace="a"}`:                                    2,
			`lockwarden_lock_waiting{namespace="a"}`:                                 3,
			`lockwarden_lock_held{namespace="b"}`:                                    0,
			`lockwarden_lock_waiting{namespace="b"}`:                                 0,
			`lockwarden_lock_transitions_total{namespace="a",transition="acquired"}`: 1,
		}
		if lockNames {
			want = map[string]float64{
				`lockwarden_lock_held{name="x",namespace="a"}`:                                    1,
				`lockwarden_lock_waiting{name="x",namespace="a"}`:                                 2,
				`lockwarden_lock_held{name="y",namespace="a"}`:                                    1,
				`lockwarden_lock_waiting{name="y",namespace="a"}`:                                 1,
				`lockwarden_lock_held{name="z",namespace="b"}`:                                    0,
				`lockwarden_lock_waiting{name="z",namespace="b"}`:                                 0,
				`lockwarden_lock_transitions_total{name="x",namespace="a",transition="acquired"}`: 1,
			}
		}
		assertSeries(t, reg, want)

		m.forget(types.NamespacedName{Namespace: "b", Name: "z"})
		for k := range want {
			if k == `lockwarden_lock_held{namespace="b"}` || k == `lockwarden_lock_waiting{namespace="b"}` ||
				k == `lockwarden_lock_held{name="z",namespace="b"}` || k == `lockwarden_lock_waiting{name="z",namespace="b"}` {
				delete(want, k)
			}
		}
		assertSeries(t, reg, want)
	}
}

// assertSeries checks the lockwarden_lock_* gauges and counters gathered
// from reg are exactly want, keyed by name{labels}.
func assertSeries(t *testing.T, reg *prometheus.Registry, want map[string]float64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if m.GetGauge() == nil && m.GetCounter() == nil {
				continue
			}
			key := f.GetName() + "{"
			for i, l := range m.GetLabel() { // sorted by name
				if i > 0 {
					key += ","
				}
				key += l.GetName() + `="` + l.GetValue() + `"`
			}
			got[key+"}"] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	if len(got) != len(want) {
		t.Errorf("series %v, want %v", got, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}
