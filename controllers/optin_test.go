package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// namingLocks creates a pod that opts in by naming its locks, with the
// label lockwarden.dev/lock (label, if not "") and the annotation
// lockwarden.dev/locks (listed, if not ""), as a pod template would: no
// gate is written by hand.
func namingLocks(t *testing.T, ns, name, label, listed string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
	}
	if label != "" {
		pod.Labels[locksv1.LockLabel] = label
	}
	if listed != "" {
		pod.Annotations[locksv1.LocksAnnotation] = listed
	}
	if err := k8s.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

func gateNames(pod *corev1.Pod) []string {
	var names []string
	for _, g := range pod.Spec.SchedulingGates {
		names = append(names, g.Name)
	}
	return names
}

// waitForGating waits until the API server applies the gating policy,
// which it does a moment after the policy is created.
func waitForGating(t *testing.T) {
	t.Helper()
	ns := newNamespace(t)
	seq := 0
	eventually(t, "the gating policy to be applied", func() bool {
		seq++
		return len(namingLocks(t, ns, fmt.Sprint("probe-", seq), "probe", "").Spec.SchedulingGates) == 1
	})
}

// One label guards a workload (issue 22): a pod created with the label
// lockwarden.dev/lock gets that lock's gate and the candidate label at
// admission, and a lock without spec.candidates selects the pods that name
// it, so a singleton needs nothing else. A pod naming several locks in the
// annotation gets each gate once, the label's too.
func TestOneLabelGuardsAPod(t *testing.T) {
	waitForGating(t)
	startManager(t)
	ns := newNamespace(t)
	run1 := namingLocks(t, ns, "run-1", "singleton", "")
	run2 := namingLocks(t, ns, "run-2", "singleton", "")
	if got := gateNames(run1); !slices.Equal(got, []string{gateFor("singleton")}) || run1.Labels[locksv1.CandidateLabel] != "true" {
		t.Fatalf("run-1 was admitted with gates %v and labels %v", got, run1.Labels)
	}
	lock := &locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "singleton"},
		Spec:       locksv1.DistributedLockSpec{LeaseDuration: &metav1.Duration{Duration: 3e9}},
	}
	if err := k8s.Create(context.Background(), lock); err != nil {
		t.Fatal(err)
	}
	eventually(t, "run-1 to be granted, and run-2 to wait", func() bool {
		st := getLock(t, lock).Status
		return holds(t, lockKey(lock), run1) && !gatedWith(getPod(t, run1), gateFor("singleton")) &&
			slices.Equal(st.Waiting, []string{"run-2"})
	})
	if !gatedWith(getPod(t, run2), gateFor("singleton")) {
		t.Fatal("run-2 was ungated while run-1 holds the lock")
	}

	both := namingLocks(t, ns, "both", "first", "first, second,")
	if got := gateNames(both); !slices.Equal(got, []string{gateFor("first"), gateFor("second")}) {
		t.Fatalf("a pod naming first (label) and first, second (annotation) got gates %v", got)
	}

	// A gate written by hand gets the candidate label too, without which a
	// manager watching only opted-in pods would never see the pod.
	byHand := createPod(t, ns, "by-hand", "job", gatedBy("singleton"))
	if byHand.Labels[locksv1.CandidateLabel] != "true" || !slices.Equal(gateNames(byHand), []string{gateFor("singleton")}) {
		t.Fatalf("a pod gated by hand was admitted with labels %v and gates %v", byHand.Labels, gateNames(byHand))
	}
}

// The manager may change only lockwarden's own marks (issue 22): the policy
// of config/admission/manager.yaml refuses any other pod change by the
// manager's ServiceAccount, and admits the marks and the lift of
// lockwarden's gates. The requests impersonate that ServiceAccount, bound
// to cluster-admin so that RBAC lets every one reach admission (the API
// server does not apply admission policies to the group system:masters).
func TestTheManagerMayChangeOnlyItsMarks(t *testing.T) {
	ns := newNamespace(t)
	cfg := rest.CopyConfig(restCfg)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":lockwarden-controller-manager",
		Groups:   []string{"system:serviceaccounts", "system:authenticated"},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "manager-writes-" + ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: cfg.Impersonate.UserName}},
	}
	if err := k8s.Create(context.Background(), binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), binding) })
	manager, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	// The API server applies a policy a moment after it is created: probe
	// with a fresh pod each time, since a change let through changes the
	// pod for good.
	probes := 0
	eventually(t, "the policy to be applied", func() bool {
		probes++
		probe := getPod(t, createPod(t, ns, fmt.Sprint("probe-", probes), "probe"))
		probe.Labels["team"] = "other"
		return manager.Update(context.Background(), probe) != nil
	})
	pod := createPod(t, ns, "p", "job", gatedBy("singleton"), func(p *corev1.Pod) {
		p.Labels["team"] = "payments"
		p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: "kueue.x-k8s.io/admission"})
	})
	change := func(mutate func(*corev1.Pod)) error {
		p := getPod(t, pod)
		mutate(p)
		return manager.Update(context.Background(), p)
	}
	for what, mutate := range map[string]func(*corev1.Pod){
		"the image":                 func(p *corev1.Pod) { p.Spec.Containers[0].Image = "evil:latest" },
		"another tool's label":      func(p *corev1.Pod) { p.Labels["team"] = "other" },
		"a new label of its own":    func(p *corev1.Pod) { p.Labels["app"] = "x" },
		"another tool's annotation": func(p *corev1.Pod) { p.Annotations = map[string]string{"note": "x"} },
		"another controller's gate": func(p *corev1.Pod) {
			p.Spec.SchedulingGates = slices.DeleteFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == "kueue.x-k8s.io/admission" })
		},
	} {
		if err := change(mutate); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("the manager changing %s: %v, want refused", what, err)
		}
	}
	if err := manager.Delete(context.Background(), getPod(t, pod)); err == nil {
		t.Error("the manager deleted a pod")
	}
	if err := change(func(p *corev1.Pod) {
		setMarksOn(p, "singleton")
		p.Spec.SchedulingGates = slices.DeleteFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == gateFor("singleton") })
	}); err != nil {
		t.Fatalf("the manager's marks and the lift of its gate were refused: %v", err)
	}
	if err := change(func(p *corev1.Pod) {
		delete(p.Labels, locksv1.HolderLabelFor("singleton"))
		for _, prefix := range locksv1.MarkAnnotationPrefixes {
			delete(p.Annotations, prefix+"singleton")
		}
	}); err != nil {
		t.Fatalf("the manager clearing its marks was refused: %v", err)
	}
}

// setMarksOn gives the pod a lock's marks, as the controller writes them.
func setMarksOn(p *corev1.Pod, lock string) {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Labels[locksv1.HolderLabelFor(lock)] = "true"
	p.Annotations[locksv1.OwnerAnnotationPrefix+lock] = string(p.UID) + ":0"
	p.Annotations[locksv1.TokenAnnotationPrefix+lock] = "7"
	p.Annotations[locksv1.SinceAnnotationPrefix+lock] = "2026-11-25T18:00:00Z"
}
