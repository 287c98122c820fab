package decide

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// The world of the table: namespaces a and b share key "k"; lock a/l and
// b/m name it; pods are named by their UIDs.

func lock(ns, name string, mutate ...func(*locksv1.DistributedLock)) *locksv1.DistributedLock {
	l := &locksv1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: locksv1.DistributedLockSpec{Key: "k"}}
	for _, m := range mutate {
		m(l)
	}
	return l
}

func records(uid string, token int64, lifted bool) func(*locksv1.DistributedLock) {
	return func(l *locksv1.DistributedLock) {
		l.Status.Grant = &locksv1.LockGrant{PodName: uid, PodUID: uid, Token: token, GateLifted: lifted}
	}
}

func deleting(l *locksv1.DistributedLock) {
	l.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
}

func pod(ns, uid string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: uid, UID: types.UID(uid), Labels: map[string]string{}},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func gated(lock string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: locksv1.GateFor(lock)})
	}
}

func selectedBy(lock string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Labels[locksv1.LockLabel] = lock }
}

func succeeded(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }

// view builds the key's view: live locks of namespaces that may use the key
// go to Locks, the others to Revoked, deleting ones to Deleting; holders
// are "<uid>:<n>".
func view(locks []*locksv1.DistributedLock, mayUse map[string]bool, pods []*corev1.Pod, holders []string, memory string) *View {
	v := &View{Key: "k", MayUse: mayUse, ByUID: map[types.UID]*corev1.Pod{}, Memory: types.UID(memory),
		Selects: func(l *locksv1.DistributedLock, p *corev1.Pod) bool { return p.Labels[locksv1.LockLabel] == l.Name }}
	for _, l := range locks {
		switch {
		case !l.DeletionTimestamp.IsZero():
			v.Deleting = append(v.Deleting, l)
		case !mayUse[l.Namespace]:
			v.Revoked = append(v.Revoked, l)
		default:
			v.Locks = append(v.Locks, l)
		}
	}
	for _, p := range pods {
		v.ByUID[p.UID] = p
		if slices.ContainsFunc(v.Locks, func(l *locksv1.DistributedLock) bool { return v.Selects(l, p) }) {
			v.Candidates = append(v.Candidates, p)
		}
	}
	for _, h := range holders {
		uid := types.UID(h[:len(h)-2])
		v.Holders = append(v.Holders, Holder{Owner: h, PodUID: uid, Pod: v.ByUID[uid]})
	}
	return v
}

var both = map[string]bool{"a": true, "b": true}

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name    string
		locks   []*locksv1.DistributedLock
		mayUse  map[string]bool
		pods    []*corev1.Pod
		holders []string
		memory  string
		// want is the grantee's UID ("" for none) and its source.
		want   string
		source Source
		// held, retake, conflict, started are the flags of the answer.
		held, retake, conflict, started bool
		blocks                          []string
		lifted, lifts                   []string
	}{{
		name:  "rule 1: the record names the grantee, taken again when Redis lost it",
		locks: []*locksv1.DistributedLock{lock("a", "l", records("p1", 3, true))}, mayUse: both,
		pods: []*corev1.Pod{pod("a", "p1", selectedBy("l")), pod("a", "p2", selectedBy("l"))},
		want: "p1", source: FromRecord, retake: true, started: true, blocks: []string{"p2"}, lifted: []string{"l"},
	}, {
		name:   "rule 1: the latest record (highest token) wins over an older one in another namespace",
		locks:  []*locksv1.DistributedLock{lock("a", "l", records("p1", 3, true)), lock("b", "m", records("q1", 7, false))},
		mayUse: both, pods: []*corev1.Pod{pod("a", "p1"), pod("b", "q1", gated("m"))}, holders: []string{"q1:0"},
		want: "q1", source: FromRecord, held: true,
	}, {
		name:  "rule 1: a record of a stopped pod names nobody; Redis's holder under :0 does",
		locks: []*locksv1.DistributedLock{lock("a", "l", records("p1", 3, true))}, mayUse: both,
		pods:    []*corev1.Pod{pod("a", "p1", succeeded), pod("a", "p2")},
		holders: []string{"p2:0"}, want: "p2", source: FromRedis, held: true, started: true,
	}, {
		name:  "rule 1: a lock records only a pod of its own namespace",
		locks: []*locksv1.DistributedLock{lock("a", "l", records("q1", 3, true))}, mayUse: both,
		pods: []*corev1.Pod{pod("b", "q1")},
	}, {
		name:  "rule 1: a deleting lock's record of a grant it lifted no gate for, of a pod no live lock claims, is over",
		locks: []*locksv1.DistributedLock{lock("a", "l", records("p1", 3, false), deleting)}, mayUse: both,
		pods: []*corev1.Pod{pod("a", "p1")},
	}, {
		name:  "rule 1: a deleting lock keeps the grant whose gate it lifted",
		locks: []*locksv1.DistributedLock{lock("a", "l", records("p1", 3, true), deleting)}, mayUse: both,
		pods: []*corev1.Pod{pod("a", "p1")}, want: "p1", source: FromRecord, retake: true, started: true, lifted: []string{"l"},
	}, {
		name:   "rule 1: a deleting lock keeps a grant a live lock of its namespace claims",
		locks:  []*locksv1.DistributedLock{lock("a", "l", records("p1", 3, false), deleting), lock("a", "l2")},
		mayUse: both, pods: []*corev1.Pod{pod("a", "p1", selectedBy("l2"))}, holders: []string{"p1:0"},
		want: "p1", source: FromRecord, held: true, started: true,
	}, {
		name:  "rule 1: a revoked lock's record is kept until its pod stops",
		locks: []*locksv1.DistributedLock{lock("b", "m", records("q1", 3, true))}, mayUse: map[string]bool{"a": true, "b": false},
		pods: []*corev1.Pod{pod("b", "q1")}, want: "q1", source: FromRecord, retake: true, started: true, lifted: []string{"m"},
	}, {
		name:  "rule 2: an in-pod client's hold is no grant",
		locks: []*locksv1.DistributedLock{lock("a", "l")}, mayUse: both,
		pods: []*corev1.Pod{pod("a", "p1", selectedBy("l")), pod("a", "p2", selectedBy("l"))}, holders: []string{"p1:1"},
		blocks: []string{"p2"},
	}, {
		name:  "rule 2: a hold for a pod of a namespace that may not use the key is no grant",
		locks: []*locksv1.DistributedLock{lock("a", "l"), lock("b", "m")}, mayUse: map[string]bool{"a": true, "b": false},
		pods: []*corev1.Pod{pod("b", "q1")}, holders: []string{"q1:0"},
	}, {
		name:  "rule 2: a hold for a pod of a namespace with no lock of the key is no grant",
		locks: []*locksv1.DistributedLock{lock("a", "l")}, mayUse: map[string]bool{"a": true, "b": true},
		pods: []*corev1.Pod{pod("b", "q1")}, holders: []string{"q1:0"},
	}, {
		name:  "rule 2: another owner holding the key over a recorded grant is a conflict",
		locks: []*locksv1.DistributedLock{lock("a", "l", records("p1", 3, true))}, mayUse: both,
		pods: []*corev1.Pod{pod("a", "p1"), pod("a", "p2", selectedBy("l"))}, holders: []string{"other:1"},
		want: "p1", source: FromRecord, conflict: true, started: true, blocks: []string{"p2"}, lifted: []string{"l"},
	}, {
		name:  "rule 3: this process's memory names a grantee nothing else records",
		locks: []*locksv1.DistributedLock{lock("a", "l")}, mayUse: both,
		pods: []*corev1.Pod{pod("a", "p1", gated("l"))}, memory: "p1", want: "p1", source: FromMemory, retake: true,
	}, {
		name:  "rule 3: memory of a stopped pod names nobody",
		locks: []*locksv1.DistributedLock{lock("a", "l")}, mayUse: both,
		pods: []*corev1.Pod{pod("a", "p1", succeeded)}, memory: "p1",
	}, {
		name:  "rule 3: memory of a pod of a namespace that may no longer use the key names nobody",
		locks: []*locksv1.DistributedLock{lock("b", "m")}, mayUse: map[string]bool{"b": false},
		pods: []*corev1.Pod{pod("b", "q1")}, memory: "q1",
	}, {
		name:  "the gate is lifted only once the live lock records the grant and the lift",
		locks: []*locksv1.DistributedLock{lock("a", "l", records("p1", 3, true)), lock("a", "l2", records("p2", 1, false))}, mayUse: both,
		pods:    []*corev1.Pod{pod("a", "p1", gated("l"), gated("l2"))},
		holders: []string{"p1:0"}, want: "p1", source: FromRecord, held: true, lifted: []string{"l"}, lifts: []string{"l"},
	}, {
		name:  "no gate is lifted for an in-pod client's hold",
		locks: []*locksv1.DistributedLock{lock("a", "l", records("p1", 3, true))}, mayUse: both,
		pods: []*corev1.Pod{pod("a", "p1", gated("l"))}, holders: []string{"p1:1"},
		want: "p1", source: FromRecord, conflict: true, lifted: []string{"l"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			v := view(tc.locks, tc.mayUse, tc.pods, tc.holders, tc.memory)
			res := v.Resolve()
			got := ""
			if res.Grantee != nil {
				got = string(res.Grantee.UID)
			}
			if got != tc.want || res.Source != tc.source {
				t.Fatalf("grantee %q from %q, want %q from %q", got, res.Source, tc.want, tc.source)
			}
			if res.Held != tc.held || res.Retake != tc.retake || res.Conflict != tc.conflict || res.Started != tc.started {
				t.Errorf("held %v retake %v conflict %v started %v, want %v %v %v %v",
					res.Held, res.Retake, res.Conflict, res.Started, tc.held, tc.retake, tc.conflict, tc.started)
			}
			if got := podNames(res.Blocks); !slices.Equal(got, tc.blocks) {
				t.Errorf("blocks %v, want %v", got, tc.blocks)
			}
			if got := lockNames(res.Lifted); !slices.Equal(got, tc.lifted) {
				t.Errorf("lifted %v, want %v", got, tc.lifted)
			}
			if got := lockNames(res.Lifts); !slices.Equal(got, tc.lifts) {
				t.Errorf("lifts %v, want %v", got, tc.lifts)
			}
		})
	}
}

func TestRecordedByAnother(t *testing.T) {
	b1 := lock("b", "b1", records("q1", 3, false), deleting)
	b2 := lock("b", "b2", records("q1", 3, false))
	q1 := pod("b", "q1")
	for _, tc := range []struct {
		name   string
		locks  []*locksv1.DistributedLock
		mayUse map[string]bool
		want   bool
	}{
		{"a refused lock records it", []*locksv1.DistributedLock{b1, b2}, map[string]bool{"b": false}, true},
		{"a live lock records it", []*locksv1.DistributedLock{b1, b2}, both, true},
		{"only the deleting lock records it", []*locksv1.DistributedLock{b1}, both, false},
		{"another namespace's lock records a pod of that name", []*locksv1.DistributedLock{b1, lock("a", "l", records("q1", 3, false))}, both, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := view(tc.locks, tc.mayUse, []*corev1.Pod{q1}, nil, "")
			if got := v.RecordedByAnother(q1, b1); got != tc.want {
				t.Fatalf("RecordedByAnother = %v, want %v", got, tc.want)
			}
		})
	}
}

func podNames(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

func lockNames(locks []*locksv1.DistributedLock) []string {
	var out []string
	for _, l := range locks {
		out = append(out, l.Name)
	}
	return out
}
