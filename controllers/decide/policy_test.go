package decide

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

func TestPolicyLock(t *testing.T) {
	marked := func(lock string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Labels[locksv1.HolderLabelFor(lock)] = "true" }
	}
	for _, tc := range []struct {
		name   string
		locks  []*locksv1.DistributedLock
		mayUse map[string]bool
		pod    *corev1.Pod
		want   string // "<namespace>/<name>", or "" for none
	}{{
		name:  "the lock that gates the pod, not another lock of the key that only names it (V3)",
		locks: []*locksv1.DistributedLock{lock("a", "a"), lock("a", "a2")},
		pod:   pod("a", "p1", gated("a"), selectedBy("a")), mayUse: both, want: "a/a",
	}, {
		name:  "a lock recording the lift of its gate wins over one gating the pod now",
		locks: []*locksv1.DistributedLock{lock("a", "a", records("p1", 1, true)), lock("a", "b")},
		pod:   pod("a", "p1", gated("b")), mayUse: both, want: "a/a",
	}, {
		name:  "a recorded grant whose gate was not lifted sets no policy by itself",
		locks: []*locksv1.DistributedLock{lock("a", "a", records("p1", 1, false)), lock("a", "b")},
		pod:   pod("a", "p1", selectedBy("b")), mayUse: both, want: "a/b",
	}, {
		name:  "gating comes before selecting, whatever the names' order",
		locks: []*locksv1.DistributedLock{lock("a", "a"), lock("a", "b")},
		pod:   pod("a", "p1", selectedBy("a"), gated("b")), mayUse: both, want: "a/b",
	}, {
		name:  "a lock that marked the pod, when none gates or selects it",
		locks: []*locksv1.DistributedLock{lock("a", "a"), lock("a", "b")},
		pod:   pod("a", "p1", marked("b")), mayUse: both, want: "a/b",
	}, {
		name:  "a lock being deleted that lifted the pod's gate keeps its policy",
		locks: []*locksv1.DistributedLock{lock("a", "a", records("p1", 1, true), deleting), lock("a", "b")},
		pod:   pod("a", "p1", selectedBy("b")), mayUse: both, want: "a/a",
	}, {
		name:  "a refused lock that lifted the pod's gate keeps its policy",
		locks: []*locksv1.DistributedLock{lock("b", "m", records("p2", 1, true))},
		pod:   pod("b", "p2"), mayUse: map[string]bool{"a": true}, want: "b/m",
	}, {
		name:  "another namespace's lock never sets the pod's policy",
		locks: []*locksv1.DistributedLock{lock("b", "a")},
		pod:   pod("a", "p1", gated("a")), mayUse: both, want: "",
	}, {
		name:  "no lock claims the pod: the API's defaults",
		locks: []*locksv1.DistributedLock{lock("a", "a")},
		pod:   pod("a", "p1"), mayUse: both, want: "",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			v := view(tc.locks, tc.mayUse, []*corev1.Pod{tc.pod}, nil, "")
			got := ""
			if l := v.PolicyLock(tc.pod); l != nil {
				got = l.Namespace + "/" + l.Name
			}
			if got != tc.want {
				t.Errorf("PolicyLock = %q, want %q", got, tc.want)
			}
		})
	}
}
