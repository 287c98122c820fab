package controllers

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
)

// finalizeDeleted decides how each lock being deleted goes once its
// promise is kept. A pod whose gate the lock lifted keeps its grant until
// it stops: a lifted gate cannot be put back, so the grant must go on
// excluding every other guarded pod, and the lock stays (Terminating) until
// then, as a PersistentVolumeClaim stays while a pod uses it. Then the lock
// releases the grants it leaves nobody to claim, removes its marks and lets
// go. Each lock's writes go in order (inOrder), and one lock's failure to
// go does not hold the others back.
func (r *DistributedLockReconciler) finalizeDeleted(_ context.Context, s *scope) ([]action, error) {
	var out []action
	for _, d := range s.Deleting {
		if p := s.WaitsFor(d); p != nil {
			// The lift the lock's record promised, if it is still to be made
			// and the key is held for the pod (else it is taken back for the
			// pod first, keepGrants).
			if decide.HasGate(p, locksv1.GateFor(d.Name)) && s.heldByController(p) {
				out = append(out, finishLift{lock: d, pod: p})
			}
			setCondition(d, locksv1.ConditionReady, metav1.ConditionFalse, "WaitingForHolder", fmt.Sprintf(
				"being deleted: pod %s, whose gate this lock lifted, keeps %s until it stops, and the lock goes then; to end its run now, delete the pod", p.Name, s.Key))
			continue
		}
		steps := r.releaseGrantsOf(s, d)
		out = append(out, append(steps, letGo{lock: d}))
	}
	return out, nil
}

// releaseGrantsOf are the writes that end, for a lock being deleted, the
// grants of its key to pods of its namespace that no live lock there
// selects, gates or marks, and that no other lock of the key, live or
// refused, records (deleting a lock is deleting its promise: a leader
// elected through it stops being one), and remove the lock's marks. A grant
// whose gate any lock of the key lifted is never released here while its
// pod runs: the lock that lifted it waits for it, whether it is live,
// refused or being deleted too. In-pod clients' holds are the pods' own.
// Its pods still behind its gate stay gated, and are told why (gates.go).
// Another deleting lock of the namespace decides the same releases; the
// first to make one makes it (release).
func (r *DistributedLockReconciler) releaseGrantsOf(s *scope, d *locksv1.DistributedLock) inOrder {
	var out inOrder
	for _, h := range s.Holders {
		name := ""
		switch gone, isGone := s.gone[h.PodUID]; {
		case !h.ByController():
		case h.Pod != nil && !decide.Stopped(h.Pod) && (s.LiftedFor(h.Pod) || s.RecordedByAnother(h.Pod, d)):
		case h.Pod != nil && h.Pod.Namespace == d.Namespace && !s.Claimed(h.Pod):
			name = h.Pod.Name
		case h.Pod == nil && isGone && gone.Namespace == d.Namespace:
			name = gone.Name
		}
		if name != "" {
			out = append(out, release{holder: h, name: name, namespace: d.Namespace, deleting: d})
		}
	}
	// A grant lost while its pod runs (kept without a hold, see keepGrants)
	// ends with the lock too, unless a lock left claims the pod.
	if g := r.grants.get(s.Key); g != nil && g.hold == nil && g.Pod.Namespace == d.Namespace {
		if p := s.ByUID[g.PodUID]; p == nil || !s.Claimed(p) {
			out = append(out, forgetGrant{pod: g.PodUID})
		}
	}
	// The grants it ends are over: no lock of the namespace records them
	// any more, or the record would name the grantee again (a grant lost to
	// somebody else is taken back for its pod once the key is free). A
	// record of a pod still held once the releases are made is kept
	// (clearRecord).
	for _, l := range s.LocksIn(d.Namespace) {
		g := l.Status.Grant
		if g == nil || g.GateLifted {
			continue
		}
		if p := s.ByUID[types.UID(g.PodUID)]; p == nil || !s.Claimed(p) {
			out = append(out, clearRecord{lock: l, pod: types.UID(g.PodUID)})
		}
	}
	// The marks are for display: one that cannot be cleared (a pod its
	// tenant made hard to patch) does not keep the lock from going (mark).
	for _, p := range s.pods {
		if p.Namespace != d.Namespace || !carriesMarks(p, d.Name) {
			continue
		}
		want := p.DeepCopy()
		clearMarks(want, d.Name)
		out = append(out, mark{pod: p, want: want})
	}
	return out
}
