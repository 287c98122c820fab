package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// The status metrics count the locks' conditions, and time the oldest pod
// behind a lock's gate, whether in line or held back, but not a candidate
// that runs (a leader election's standby waits by design). A standby
// manager exports none of it.
func TestStatusMetrics(t *testing.T) {
	ctx := context.Background()
	_, c := apiServer(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "status-metrics-"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, gates ...string) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}}},
		}
		for _, g := range gates {
			p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: g})
		}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lock := func(name string, waiting []string, blocked []string, conditions ...metav1.Condition) {
		l := &locksv1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name},
			Spec:       locksv1.DistributedLockSpec{Candidates: &locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"app": locksv1.LabelValue(name)}}},
		}
		if err := c.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
		l.Status.Waiting = waiting
		for _, b := range blocked {
			l.Status.Blocked = append(l.Status.Blocked, locksv1.BlockedPod{PodName: b, Reason: "another lock's gate"})
		}
		for _, cond := range conditions {
			cond.LastTransitionTime = metav1.Now()
			l.Status.Conditions = append(l.Status.Conditions, cond)
		}
		if err := c.Status().Update(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	ready := metav1.Condition{Type: "Ready", Status: "True", Reason: "Ready"}
	unavailable := metav1.Condition{Type: "Ready", Status: "False", Reason: "RedisUnavailable"}
	conflict := metav1.Condition{Type: "Conflict", Status: "True", Reason: "HeldElsewhere"}
	notStarted := metav1.Condition{Type: "HolderStarted", Status: "False", Reason: "NotStarted"}

	pod("gated-a", locksv1.GateFor("batch"))
	pod("held-back", locksv1.GateFor("batch"), "example.com/other")
	pod("standby") // a running candidate, no gate
	pod("gated-elsewhere", locksv1.GateFor("other"))
	lock("batch", []string{"gated-a"}, []string{"held-back"}, ready, notStarted)
	lock("leader", []string{"standby", "gated-elsewhere", "gone"}, nil, ready, conflict)
	lock("broken", nil, nil, unavailable)

	elected := make(chan struct{})
	// Only this test's namespace: other tests share the API server.
	m := newStatusMetrics(client.NewNamespacedClient(c, ns.Name), elected, false, logr.Discard())
	m.now = func() time.Time { return time.Now().Add(time.Hour) }
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Fatalf("a standby exports %d series (%v), want none", n, err)
	}
	close(elected)

	want := `
# HELP lockwarden_lock_conditions DistributedLocks by condition type, status and reason, as their statuses say (summed over the namespace unless lock names are on).
# TYPE lockwarden_lock_conditions gauge
lockwarden_lock_conditions{namespace="NS",reason="HeldElsewhere",status="True",type="Conflict"} 1
lockwarden_lock_conditions{namespace="NS",reason="NotStarted",status="False",type="HolderStarted"} 1
lockwarden_lock_conditions{namespace="NS",reason="Ready",status="True",type="Ready"} 2
lockwarden_lock_conditions{namespace="NS",reason="RedisUnavailable",status="False",type="Ready"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(strings.ReplaceAll(want, "NS", ns.Name)), "lockwarden_lock_conditions"); err != nil {
		t.Error(err)
	}
	// Only batch's two pods count: about an hour old, by the clock above.
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var age float64
	for _, f := range families {
		if f.GetName() == "lockwarden_lock_oldest_gated_seconds" {
			age = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if age < 3590 || age > 3700 {
		t.Errorf("lockwarden_lock_oldest_gated_seconds = %v, want about 3600", age)
	}

	// With lock names, one series per lock. leader's waiting pods are a
	// running standby, a pod behind another lock's gate and a pod gone:
	// none counts.
	named := newStatusMetrics(client.NewNamespacedClient(c, ns.Name), elected, true, logr.Discard())
	named.now = m.now
	reg = prometheus.NewRegistry()
	reg.MustRegister(named)
	if families, err = reg.Gather(); err != nil {
		t.Fatal(err)
	}
	ages := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "lockwarden_lock_oldest_gated_seconds" {
			continue
		}
		for _, metric := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range metric.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] != ns.Name {
				t.Errorf("series of another namespace: %v", labels)
			}
			ages[labels["name"]] = metric.GetGauge().GetValue()
		}
	}
	if len(ages) != 3 || ages["batch"] < 3590 || ages["leader"] != 0 || ages["broken"] != 0 {
		t.Errorf("per lock: %v, want batch about 3600, leader and broken 0", ages)
	}
}
