package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

func TestGrantAndHandOverInOrder(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	a := createPod(t, ns, "a", "web")
	b := createPod(t, ns, "b", "web")
	c := createPod(t, ns, "c", "web")
	lock := createLock(t, ns, "leader", "web")
	key := ns + "/leader"

	eventually(t, "pod a to hold the lock", func() bool { return holderOf(t, lock) == "a" })
	st := getLock(t, lock).Status
	if st.Key != key || st.Holder.OwnerID != string(a.UID)+":0" || !st.Holder.GrantedByController {
		t.Fatalf("status = %+v, want key %s held by %s:0 for the controller", st, key, a.UID)
	}
	if fmt.Sprint(st.Waiting) != "[b c]" || st.WaitingCount != 2 {
		t.Fatalf("waiting = %v (%d), want [b c]", st.Waiting, st.WaitingCount)
	}
	for _, cond := range []string{locksv1.ConditionReady, locksv1.ConditionHeld} {
		c := meta.FindStatusCondition(st.Conditions, cond)
		if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != getLock(t, lock).Generation {
			t.Fatalf("condition %s = %+v, want True at the current generation", cond, c)
		}
	}
	info := inspect(t, key)
	if len(info.Holders) != 1 || string(info.Holders[0].Owner) != st.Holder.OwnerID || info.Token != st.Holder.Token {
		t.Fatalf("Redis has %+v, status says %+v", info, st.Holder)
	}
	assertMarked(t, a, "leader", st.Holder.Token)

	// Succeeded: the next pod in line takes over, with a higher token.
	setPhase(t, getPod(t, a), corev1.PodSucceeded)
	eventually(t, "pod b to hold the lock", func() bool { return holderOf(t, lock) == "b" })
	next := getLock(t, lock).Status
	if next.Holder.Token <= st.Holder.Token {
		t.Fatalf("token went from %d to %d", st.Holder.Token, next.Holder.Token)
	}
	assertMarked(t, b, "leader", next.Holder.Token)
	eventually(t, "pod a to be unmarked", func() bool { return !marked(getPod(t, a)) })

	// Failed: on to the last.
	setPhase(t, getPod(t, b), corev1.PodFailed)
	eventually(t, "pod c to hold the lock", func() bool { return holderOf(t, lock) == "c" })

	// Deleted outright: nobody is left, and the lock is free in Redis.
	if err := k8s.Delete(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lock to be free", func() bool { return holderOf(t, lock) == "" && !inspect(t, key).Held() })
	held := meta.FindStatusCondition(getLock(t, lock).Status.Conditions, locksv1.ConditionHeld)
	if held == nil || held.Status != metav1.ConditionFalse {
		t.Fatalf("Held condition = %+v, want False", held)
	}
	assertEvents(t, ns, "Acquired", "HolderTerminated")
}

func TestGateRemovedOnlyFromHolder(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	// The oldest candidate is neither gated nor running: it is passed over.
	pending := createPod(t, ns, "run-0", "job", func(p *corev1.Pod) { p.Spec.SchedulingGates = nil })
	setPhase(t, getPod(t, pending), corev1.PodPending)
	first := createPod(t, ns, "run-1", "job", gatedBy("singleton"))
	second := createPod(t, ns, "run-2", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job")

	eventually(t, "run-1 to hold the lock", func() bool { return holderOf(t, lock) == "run-1" })
	eventually(t, "run-1 to be ungated", func() bool { return len(getPod(t, first).Spec.SchedulingGates) == 0 })
	if !gated(getPod(t, second)) {
		t.Fatal("run-2 lost its gate while run-1 holds the lock")
	}
	if w := getLock(t, lock).Status.Waiting; fmt.Sprint(w) != "[run-2]" {
		t.Fatalf("waiting = %v, want [run-2]", w)
	}
	if marked(getPod(t, pending)) {
		t.Fatal("a pending pod without the gate was marked")
	}
	// Still gated after a while: the gate is not lifted by anything else.
	time.Sleep(300 * time.Millisecond)
	if !gated(getPod(t, second)) {
		t.Fatal("run-2 lost its gate while run-1 holds the lock")
	}

	// run-1 was scheduled and ran; it finishes, and run-2 may start.
	setPhase(t, getPod(t, first), corev1.PodSucceeded)
	eventually(t, "run-2 to hold the lock", func() bool { return holderOf(t, lock) == "run-2" })
	eventually(t, "run-2 to be ungated", func() bool { return !gated(getPod(t, second)) })
}

func TestInPodClientHolderReleasedOnTermination(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	app := createPod(t, ns, "app", "api")
	standby := createPod(t, ns, "standby", "api")
	// The in-pod client takes the lock before the lock resource exists, as
	// an application would at start-up.
	key := ns + "/leader"
	lease := inPodLock(t, app, key)
	lock := createLock(t, ns, "leader", "api")

	eventually(t, "the in-pod client's hold to show", func() bool { return holderOf(t, lock) == "app" })
	st := getLock(t, lock).Status
	if st.Holder.GrantedByController || st.Holder.OwnerID != string(lease.Owner()) || st.Holder.Token != lease.Token() {
		t.Fatalf("holder = %+v, want the in-pod owner %s with token %d", st.Holder, lease.Owner(), lease.Token())
	}

	setPhase(t, getPod(t, app), corev1.PodFailed)
	eventually(t, "standby to hold the lock", func() bool { return holderOf(t, lock) == "standby" })
	eventually(t, "the in-pod client to learn it lost the lock", func() bool { return lease.Err() != nil })
	info := inspect(t, key)
	if len(info.Holders) != 1 || string(info.Holders[0].Owner) != string(standby.UID)+":0" {
		t.Fatalf("Redis holders = %+v, want only standby", info.Holders)
	}
}

func TestFinalizerReleasesRedis(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	a := createPod(t, ns, "a", "web")
	lock := createLock(t, ns, "leader", "web")
	eventually(t, "pod a to hold the lock", func() bool { return holderOf(t, lock) == "a" })
	if !slices.Contains(getLock(t, lock).Finalizers, locksv1.Finalizer) {
		t.Fatal("no finalizer on the lock")
	}

	if err := k8s.Delete(context.Background(), lock); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lock resource to go", func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKeyFromObject(lock), &locksv1.DistributedLock{}))
	})
	if info := inspect(t, ns+"/leader"); info.Held() {
		t.Fatalf("the lock is still held in Redis after its resource was deleted: %+v (pod a %s)", info, getPod(t, a).UID)
	}
	eventually(t, "pod a to be unmarked", func() bool { return !marked(getPod(t, a)) })
	assertEvents(t, ns, "Released")
}

func TestAdoptionAfterManagerRestart(t *testing.T) {
	first := startManager(t)
	ns := newNamespace(t)
	createPod(t, ns, "a", "web")
	createPod(t, ns, "b", "web")
	lock := createLock(t, ns, "leader", "web", func(l *locksv1.DistributedLock) {
		l.Spec.LeaseDuration = &metav1.Duration{Duration: time.Second}
	})
	eventually(t, "pod a to hold the lock", func() bool { return holderOf(t, lock) == "a" })
	before := getLock(t, lock).Status.Holder

	first.stop()
	// The 1 s lease could run out while a loaded machine starts the next
	// manager, which would then rightly take the key anew. So the key is
	// given a minute here: the new manager's adoption re-enters it, which
	// sets its lease back to the lock's 1 s.
	key := ns + "/leader"
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	if err := rdb.PExpire(context.Background(), key, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	startManager(t)
	eventually(t, "the new manager to adopt the key", func() bool {
		info := inspect(t, key)
		return info.TTL > 0 && info.TTL <= time.Second
	})
	// Past several leases, the new manager keeps the lock for the same pod
	// and ownership: same owner, same token, same since.
	time.Sleep(3 * time.Second)
	after := getLock(t, lock).Status.Holder
	if after == nil || after.OwnerID != before.OwnerID || after.Token != before.Token || !after.Since.Equal(&before.Since) {
		t.Fatalf("holder changed across the restart: %+v -> %+v", before, after)
	}
	info := inspect(t, key)
	if len(info.Holders) != 1 || string(info.Holders[0].Owner) != before.OwnerID || info.Token != before.Token || info.TTL <= 0 {
		t.Fatalf("Redis after restart = %+v, want %s still holding token %d", info, before.OwnerID, before.Token)
	}
}

func TestNoAPIWritesWhileHeldSteadily(t *testing.T) {
	h := startManager(t)
	ns := newNamespace(t)
	createPod(t, ns, "a", "web")
	createPod(t, ns, "b", "web")
	lock := createLock(t, ns, "leader", "web", func(l *locksv1.DistributedLock) {
		// A lease a loaded machine's stalls do not end (a lost lease is
		// written), renewed often.
		l.Spec.LeaseDuration = &metav1.Duration{Duration: 3 * time.Second}
		l.Spec.RenewInterval = &metav1.Duration{Duration: 250 * time.Millisecond}
	})
	eventually(t, "pod a to hold the lock", func() bool { return holderOf(t, lock) == "a" })
	time.Sleep(500 * time.Millisecond) // let the grant's own writes finish

	before := h.writes.Load()
	time.Sleep(4 * time.Second) // 16 renewal intervals, past a lease
	if n := h.writes.Load() - before; n != 0 {
		t.Fatalf("%d API writes while the lock was held steadily, want 0", n)
	}
	info := inspect(t, ns+"/leader")
	if !info.Held() || info.TTL <= 0 || holderOf(t, lock) != "a" {
		t.Fatalf("the lock was not kept: %+v", info)
	}
}

// TestLostLeaseReported takes the lock away from the controller behind its
// back: the watchdog's renewal finds another owner, the controller reports
// the loss, and grants the lock again once it is free.
func TestLostLeaseReported(t *testing.T) {
	h := startManager(t)
	ns := newNamespace(t)
	a := createPod(t, ns, "a", "web")
	lock := createLock(t, ns, "leader", "web", func(l *locksv1.DistributedLock) {
		l.Spec.LeaseDuration = &metav1.Duration{Duration: time.Second}
	})
	eventually(t, "pod a to hold the lock", func() bool { return holderOf(t, lock) == "a" })
	token := getLock(t, lock).Status.Holder.Token
	if got := metricValue(t, h, "lockwarden_lock_held", ns); got != 1 {
		t.Fatalf("lockwarden_lock_held = %v, want 1", got)
	}

	// An operator force-releases the pod's hold directly in Redis.
	if _, err := lockClient(t, "operator").ForceReleaseClient(context.Background(), ns+"/leader", string(a.UID)); err != nil {
		t.Fatal(err)
	}
	assertEvents(t, ns, "Lost")
	eventually(t, "the lock to be granted again", func() bool {
		st := getLock(t, lock).Status
		return st.Holder != nil && st.Holder.PodName == "a" && st.Holder.Token > token
	})
}

func TestPrinterColumns(t *testing.T) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: "distributedlocks.locks.lockwarden.dev"}, crd); err != nil {
		t.Fatal(err)
	}
	if got := crd.Spec.Names.ShortNames; fmt.Sprint(got) != "[dlock]" {
		t.Errorf("short names = %v, want [dlock]", got)
	}
	var columns []string
	for _, c := range crd.Spec.Versions[0].AdditionalPrinterColumns {
		columns = append(columns, fmt.Sprintf("%s:%d", c.Name, c.Priority))
	}
	if fmt.Sprint(columns) != "[Key:0 Ready:0 Holder:0 Token:0 Waiting:0 Conflict:0 Lease:1 Age:0]" {
		t.Errorf("printer columns = %v, want key, ready, holder, token, waiting, conflict, age, and the lease in -o wide", columns)
	}
}

func TestBadSpecsRefusedAtAdmission(t *testing.T) {
	ns := newNamespace(t)
	cases := []struct {
		name   string
		mutate func(*locksv1.DistributedLock)
		want   string
	}{
		{"lease under 1s", func(l *locksv1.DistributedLock) { l.Spec.LeaseDuration.Duration = 500 * time.Millisecond }, "between 1s and 1h"},
		{"lease over 1h", func(l *locksv1.DistributedLock) { l.Spec.LeaseDuration.Duration = 2 * time.Hour }, "between 1s and 1h"},
		{"renew at the lease", func(l *locksv1.DistributedLock) {
			l.Spec.RenewInterval = &metav1.Duration{Duration: l.Spec.LeaseDuration.Duration}
		}, "renewInterval must be shorter than spec.leaseDuration"},
		{"renew above the lease", func(l *locksv1.DistributedLock) {
			l.Spec.RenewInterval = &metav1.Duration{Duration: time.Minute}
		}, "renewInterval must be shorter than spec.leaseDuration"},
		{"invalid label key", func(l *locksv1.DistributedLock) {
			l.Spec.Candidates.MatchLabels = map[string]locksv1.LabelValue{"bad key!": "x"}
		}, "matchLabels keys must be valid label keys"},
		{"invalid label value", func(l *locksv1.DistributedLock) {
			l.Spec.Candidates.MatchLabels = map[string]locksv1.LabelValue{"app": "-bad-"}
		}, "spec.candidates.matchLabels.app in body should match"},
		{"In without values", func(l *locksv1.DistributedLock) {
			l.Spec.Candidates = &locksv1.PodSelector{MatchExpressions: []locksv1.LabelRequirement{{Key: "app", Operator: "In"}}}
		}, "values must be non-empty for the operators In and NotIn"},
		{"unknown operator", func(l *locksv1.DistributedLock) {
			l.Spec.Candidates = &locksv1.PodSelector{MatchExpressions: []locksv1.LabelRequirement{{Key: "app", Operator: "Near", Values: []locksv1.LabelValue{"x"}}}}
		}, "Unsupported value: \"Near\""},
		{"empty selector", func(l *locksv1.DistributedLock) { l.Spec.Candidates = &locksv1.PodSelector{} }, "must select pods"},
		{"unknown mode", func(l *locksv1.DistributedLock) { l.Spec.Mode = "Steal" }, "Unsupported value: \"Steal\""},
		{"key with a hash tag", func(l *locksv1.DistributedLock) { l.Spec.Key = "a{b}" }, "must not contain '{', '}'"},
		{"name too long for a label", func(l *locksv1.DistributedLock) { l.Name = strings.Repeat("n", 64) }, "at most 63 characters"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lock := newLock(ns, "bad", "web")
			tc.mutate(lock)
			err := k8s.Create(context.Background(), lock)
			if err == nil || !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("create: %v; want Invalid with %q", err, tc.want)
			}
		})
	}

	t.Run("changed key", func(t *testing.T) {
		lock := createLock(t, ns, "keyed", "web", func(l *locksv1.DistributedLock) { l.Spec.Key = "payments" })
		lock.Spec.Key = "payments-v2"
		err := k8s.Update(context.Background(), lock)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.key is immutable") {
			t.Fatalf("update: %v; want Invalid, spec.key is immutable", err)
		}
		lock = getLock(t, lock)
		lock.Spec.Key = ""
		err = k8s.Update(context.Background(), lock)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "cannot be added or removed") {
			t.Fatalf("update removing the key: %v; want Invalid", err)
		}
	})

	t.Run("changed mode", func(t *testing.T) {
		lock := createLock(t, ns, "moded", "web")
		lock = getLock(t, lock)
		if lock.Spec.Mode != locksv1.ModeGrant {
			t.Fatalf("default mode = %q, want Grant", lock.Spec.Mode)
		}
		lock.Spec.Mode = locksv1.ModeObserve
		err := k8s.Update(context.Background(), lock)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.mode is immutable") {
			t.Fatalf("update: %v; want Invalid, spec.mode is immutable", err)
		}
	})

	t.Run("defaults", func(t *testing.T) {
		lock := newLock(ns, "defaulted", "web")
		lock.Spec.LeaseDuration = nil
		if err := k8s.Create(context.Background(), lock); err != nil {
			t.Fatal(err)
		}
		if got := getLock(t, lock).Spec.LeaseDuration.Duration; got != 30*time.Second {
			t.Fatalf("default lease = %v, want 30s", got)
		}
	})
}

// metricValue sums a gauge or counter over its series for one namespace in
// the manager's registry.
func metricValue(t *testing.T, h *harness, name, namespace string) float64 {
	t.Helper()
	families, err := h.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "namespace" && l.GetValue() == namespace }) {
				sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// assertMarked waits for the holder pod's label and annotations.
func assertMarked(t *testing.T, pod *corev1.Pod, lockName string, token int64) {
	t.Helper()
	eventually(t, "pod "+pod.Name+" to be marked", func() bool {
		p := getPod(t, pod)
		return p.Labels[locksv1.HolderLabelFor(lockName)] == "true" &&
			p.Annotations[locksv1.OwnerAnnotationPrefix+lockName] == string(p.UID)+":0" &&
			p.Annotations[locksv1.TokenAnnotationPrefix+lockName] == strconv.FormatInt(token, 10) &&
			p.Annotations[locksv1.SinceAnnotationPrefix+lockName] != ""
	})
	since, err := time.Parse(time.RFC3339, getPod(t, pod).Annotations[locksv1.SinceAnnotationPrefix+lockName])
	if err != nil || time.Since(since) > time.Minute {
		t.Fatalf("since annotation %v (%v) is not a recent time", since, err)
	}
}

func assertEvents(t *testing.T, ns string, reasons ...string) {
	t.Helper()
	eventually(t, fmt.Sprintf("events %v", reasons), func() bool {
		var events corev1.EventList
		if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for _, want := range reasons {
			if !slices.ContainsFunc(events.Items, func(e corev1.Event) bool { return e.Reason == want }) {
				return false
			}
		}
		return true
	})
}
