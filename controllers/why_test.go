package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lockwarden/lockwarden/internal/why"
)

// `lockwarden why` (issue 22) says why a pod waits: for a granted pod, its
// grant; for a waiting one, who holds the key and its place in line; for a
// misconfigured one, what is wrong, and another controller's gate.
func TestWhyExplainsAWaitingPod(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	run1 := createPod(t, ns, "run-1", "job", gatedBy("singleton"))
	createPod(t, ns, "run-2", "job", gatedBy("singleton"))
	createPod(t, ns, "stray", "job", gatedBy("singleton", "missing"), func(p *corev1.Pod) {
		p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: "kueue.x-k8s.io/admission"})
	})
	lock := createLock(t, ns, "singleton", "job")
	eventually(t, "run-1 to be granted and the others placed", func() bool {
		st := getLock(t, lock).Status
		return holderOf(t, lock) == "run-1" && len(st.Waiting) == 1 && len(st.Blocked) == 1
	})
	explain := func(pod string) string {
		out, err := why.Explain(context.Background(), k8s, ns, pod)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("lockwarden why %s:\n%s", pod, out)
		return out
	}
	key := lockKey(lock)
	for pod, want := range map[string][]string{
		"run-1": {"pod run-1 carries no scheduling gate", "lock singleton (key " + key + "): granted to it, fencing token " +
			getPod(t, run1).Annotations["token.lockwarden.dev/singleton"]},
		"run-2": {"pod run-2 waits behind 1 scheduling gate(s)", "lock singleton (key " + key + "): held by pod run-1", "waiting: 1st of 1 in line"},
		"stray": {"pod stray waits behind 3 scheduling gate(s)", "lock singleton (key " + key + "): held by pod run-1",
			"not in line: behind another controller's scheduling gate kueue.x-k8s.io/admission",
			`lock missing: MISCONFIGURED: no DistributedLock "missing" in namespace ` + ns,
			"gate kueue.x-k8s.io/admission: another controller's"},
	} {
		out := explain(pod)
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("lockwarden why %s says\n%s\nwant it to say %q", pod, out, w)
			}
		}
	}
}

// `lockwarden free` (issue 22: uninstalling) lifts lockwarden's gates, and
// only those, from every pod of a namespace.
func TestFreeLiftsOnlyLockwardensGates(t *testing.T) {
	ns := newNamespace(t)
	createPod(t, ns, "guarded", "job", gatedBy("singleton", "other"))
	createPod(t, ns, "queued", "job", gatedBy("singleton"), func(p *corev1.Pod) {
		p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: "kueue.x-k8s.io/admission"})
	})
	createPod(t, ns, "free", "job")
	freed, err := why.Free(context.Background(), k8s, ns)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(freed) != fmt.Sprintf("[%s/guarded %s/queued]", ns, ns) {
		t.Fatalf("freed %v", freed)
	}
	if gates := getPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guarded"}}).Spec.SchedulingGates; len(gates) != 0 {
		t.Errorf("guarded keeps gates %v", gates)
	}
	if gates := getPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "queued"}}).Spec.SchedulingGates; len(gates) != 1 || gates[0].Name != "kueue.x-k8s.io/admission" {
		t.Errorf("queued has gates %v, want Kueue's alone", gates)
	}
}
