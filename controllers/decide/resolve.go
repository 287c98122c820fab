// Package decide is who holds a Redis key, decided from what one reconcile
// read: the locks naming the key and the grants their statuses record, the
// holders Redis shows, the pods as the API server (or its cache) shows them,
// and this process's memory of its grant. It imports no client and no
// Redis: its rules are pure functions of a View, tested by tables, and
// explored over every interleaving of two managers by the model check.
//
// The record of a grant is status.grant of the locks naming the key: the
// controller writes it there before it lifts a gate with the grant, and
// clears it only once the API server shows the pod stopped or gone; only
// the controller writes a lock's status. A pod's marks, and status.holder,
// are for display: its tenant can write the marks, and Redis can lose a
// hold or show somebody else's meanwhile.
//
// The controller (package controllers) reads the View, asks Resolve, and
// writes what follows from the answer; nothing else decides who holds a
// key.
package decide

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// View is what one reconcile of a key read. Its objects are read, never
// written, here.
type View struct {
	Key string
	// Locks are the live locks naming the key whose namespaces may use it,
	// by namespace and name.
	Locks []*locksv1.DistributedLock
	// Revoked are the live locks naming the key from namespaces that may
	// not use it (any more). They grant nothing; a grant one of them
	// recorded while it could is kept until its pod stops.
	Revoked []*locksv1.DistributedLock
	// Deleting are the locks naming the key that are being deleted and
	// still carry the finalizer, whichever their namespace.
	Deleting []*locksv1.DistributedLock
	// MayUse says, for each namespace of the key's locks, whether it may
	// use the key.
	MayUse map[string]bool
	// ByUID are the pods the key concerns, as the API server or the cache
	// shows them.
	ByUID map[types.UID]*corev1.Pod
	// Candidates are the pods some live lock in mode Grant selects, oldest
	// first: the one waiting order of the key.
	Candidates []*corev1.Pod
	// Holders are the owners of the key Redis shows.
	Holders []Holder
	// Memory is the pod this process last granted the key to, if it
	// remembers one: a cache, which may name the grantee and never
	// releases anything.
	Memory types.UID
	// Selects reports whether a lock selects a pod (its candidate
	// selector, or the pod naming it).
	Selects func(*locksv1.DistributedLock, *corev1.Pod) bool
}

// Holder is an owner of the key in Redis. Pod is set when the owner ID
// starts with the UID of a pod of the key's namespaces.
type Holder struct {
	Owner  string
	PodUID types.UID
	Pod    *corev1.Pod
}

// ByController reports whether the controller holds the key for the pod
// ("<pod UID>:0"), rather than the pod's own client.
func (h Holder) ByController() bool { return strings.HasSuffix(h.Owner, ":0") }

// Source is where a grant comes from.
type Source string

const (
	// FromRecord: a lock's status records the grant (status.grant).
	FromRecord Source = "record"
	// FromRedis: Redis holds the key for the pod under "<pod UID>:0", in a
	// namespace with a lock that may use the key; a grant with no gate to
	// lift, or not recorded yet.
	FromRedis Source = "redis"
	// FromMemory: this process remembers granting the key to the pod.
	FromMemory Source = "memory"
)

// Resolution is who holds the key, and what follows from it.
type Resolution struct {
	// Grantee is the pod the key is granted to that has not stopped, or
	// nil; Source says where that comes from, and Record is the status
	// record when it comes from one.
	Grantee *corev1.Pod
	Source  Source
	Record  *locksv1.LockGrant
	// Held: Redis holds the key for the grantee under the controller's
	// owner ID (the hold is adopted, or renewed). Retake: the key is free
	// in Redis, and is taken again for the grantee, never given to anyone
	// else. Conflict: somebody else holds the key meanwhile, and nobody
	// else is granted it until the grantee stops.
	Held, Retake, Conflict bool
	// Started: the grantee carries no gate of the key's locks, so it may
	// run; a hold taken again for it is never given back while it does.
	Started bool
	// Blocks are the candidates kept waiting by the grant, or by Redis's
	// holder: every candidate but the grantee and the holders that has not
	// stopped.
	Blocks []*corev1.Pod
	// Lifted are the locks whose status records lifting their gate from the
	// grantee: the grant is kept until the pod stops, whatever happens to
	// them.
	Lifted []*locksv1.DistributedLock
	// Lifts are the live locks whose gate the holder's grant lifts now:
	// the controller holds the key for the pod, and each records the grant
	// and the lift (RecordsLift) before it is lifted.
	Lifts []*locksv1.DistributedLock
}

// Resolve decides who holds the key, by these rules, in order:
//  1. the latest grant the statuses record (the highest token), if its pod
//     has not stopped (RecordedGrantee);
//  2. else Redis's holder under "<pod UID>:0", if its pod has not stopped
//     and its namespace may use the key and has a lock naming it;
//  3. else the pod this process remembers granting it to, if it has not
//     stopped and may hold a grant of the key (MayHoldGrant).
//
// A grant is sticky: until the grantee stops, the key is held for it again
// when Redis lost it, and nobody else is granted it while another owner
// holds it.
func (v *View) Resolve() Resolution {
	var res Resolution
	if p, record := v.RecordedGrantee(); p != nil {
		res.Grantee, res.Source, res.Record = p, FromRecord, record
	} else if p := v.redisGrantee(); p != nil {
		res.Grantee, res.Source = p, FromRedis
	} else if p := v.ByUID[v.Memory]; v.Memory != "" && p != nil && !Stopped(p) && v.MayHoldGrant(p) {
		res.Grantee, res.Source = p, FromMemory
	}
	if g := res.Grantee; g != nil {
		h, held := v.HeldBy(g.UID)
		res.Held = held && h.ByController()
		res.Retake = len(v.Holders) == 0
		res.Conflict = !res.Held && !res.Retake
		res.Started = !v.gatedByKey(g)
		for _, l := range v.All() {
			if st := l.Status.Grant; st != nil && st.GateLifted && st.PodUID == string(g.UID) && l.Namespace == g.Namespace {
				res.Lifted = append(res.Lifted, l)
			}
		}
	}
	if res.Grantee != nil || len(v.Holders) > 0 {
		for _, p := range v.Candidates {
			if _, holds := v.HeldBy(p.UID); !holds && (res.Grantee == nil || p.UID != res.Grantee.UID) && !Stopped(p) {
				res.Blocks = append(res.Blocks, p)
			}
		}
	}
	if p := v.HolderPod(); p != nil {
		for _, l := range v.LocksIn(p.Namespace) {
			if v.LiftsGate(l, p) && RecordsLift(l, p) {
				res.Lifts = append(res.Lifts, l)
			}
		}
	}
	return res
}

// redisGrantee is rule 2 of Resolve.
func (v *View) redisGrantee() *corev1.Pod {
	for _, h := range v.Holders {
		if h.Pod != nil && h.ByController() && !Stopped(h.Pod) && v.MayUse[h.Pod.Namespace] && v.HasLockIn(h.Pod.Namespace) {
			return h.Pod
		}
	}
	return nil
}

// gatedByKey reports whether the pod carries the gate of any lock of the
// key, live, refused or being deleted.
func (v *View) gatedByKey(pod *corev1.Pod) bool {
	return slices.ContainsFunc(v.All(), func(l *locksv1.DistributedLock) bool {
		return l.Namespace == pod.Namespace && HasGate(pod, locksv1.GateFor(l.Name))
	})
}

// All are the view's locks of every kind.
func (v *View) All() []*locksv1.DistributedLock {
	return append(append(slices.Clip(v.Locks), v.Revoked...), v.Deleting...)
}

// RecordedGrantee is the pod of the latest grant the statuses of the key's
// locks record (the highest token), if it has not stopped, and that record.
// A lock's status only ever records a pod of its own namespace. A lock
// being deleted keeps a grant whose gate it lifted, or whose pod a live
// lock of its namespace claims; its record of any other grant is over once
// it released it, though the cache may show the lock a while longer.
func (v *View) RecordedGrantee() (*corev1.Pod, *locksv1.LockGrant) {
	var pod *corev1.Pod
	var record *locksv1.LockGrant
	for _, l := range v.All() {
		st := l.Status.Grant
		if st == nil {
			continue
		}
		p := v.ByUID[types.UID(st.PodUID)]
		if p == nil || p.Namespace != l.Namespace || Stopped(p) {
			continue
		}
		if !l.DeletionTimestamp.IsZero() && !st.GateLifted && !v.Claimed(p) {
			continue
		}
		if record == nil || st.Token > record.Token {
			pod, record = p, st
		}
	}
	return pod, record
}

// MayHoldGrant reports whether the pod may hold a grant of the key: its
// namespace may use the key and has a lock naming it (live, or being
// deleted), or a lock of its namespace records the grant in its status.
func (v *View) MayHoldGrant(pod *corev1.Pod) bool {
	if v.MayUse[pod.Namespace] && v.HasLockIn(pod.Namespace) {
		return true
	}
	p, _ := v.RecordedGrantee()
	return p != nil && p.UID == pod.UID
}

// HasLockIn reports whether a live or deleting lock of the namespace names
// the key.
func (v *View) HasLockIn(namespace string) bool {
	return len(v.LocksIn(namespace)) > 0 || len(v.DeletingIn(namespace)) > 0
}

// LiftedFor reports whether a lock of the key records that it lifted its
// gate from the pod: such a grant is kept until the pod stops, whatever
// happens to the lock.
func (v *View) LiftedFor(pod *corev1.Pod) bool {
	for _, l := range v.All() {
		if st := l.Status.Grant; st != nil && st.GateLifted && st.PodUID == string(pod.UID) && l.Namespace == pod.Namespace {
			return true
		}
	}
	return false
}

// Claimed reports whether a live lock of the pod's namespace selects the
// pod, gates it or marks it: a grant of the key to such a pod outlives the
// deletion of another lock that made it.
func (v *View) Claimed(pod *corev1.Pod) bool {
	for _, l := range v.LocksIn(pod.Namespace) {
		if v.Selects(l, pod) || HasGate(pod, locksv1.GateFor(l.Name)) || MarkedBy(pod, l.Name) {
			return true
		}
	}
	return false
}

// RecordedByAnother reports whether a lock of the key other than except,
// live or refused (not being deleted), records the pod's grant: deleting
// except does not end a grant another lock still records.
func (v *View) RecordedByAnother(pod *corev1.Pod, except *locksv1.DistributedLock) bool {
	for _, l := range append(slices.Clip(v.Locks), v.Revoked...) {
		if st := l.Status.Grant; l != except && st != nil && st.PodUID == string(pod.UID) && l.Namespace == pod.Namespace {
			return true
		}
	}
	return false
}

// WaitsFor is the pod the deleting lock's status records it lifted its gate
// from, if that pod has not stopped: the lock keeps its grant until then.
func (v *View) WaitsFor(d *locksv1.DistributedLock) *corev1.Pod {
	st := d.Status.Grant
	if st == nil || !st.GateLifted {
		return nil
	}
	if p := v.ByUID[types.UID(st.PodUID)]; p != nil && p.Namespace == d.Namespace && !Stopped(p) {
		return p
	}
	return nil
}

// LiftsGate reports whether the controller holds the key for the pod and
// the lock, live and in mode Grant, gates it: the grant lifts its gate.
func (v *View) LiftsGate(l *locksv1.DistributedLock, pod *corev1.Pod) bool {
	h, ok := v.HeldBy(pod.UID)
	return ok && h.ByController() && l.DeletionTimestamp.IsZero() && v.MayUse[l.Namespace] && GrantsFor(l) &&
		l.Namespace == pod.Namespace && HasGate(pod, locksv1.GateFor(l.Name))
}

// Lifting reports whether a gate will be lifted from the pod once the grant
// is recorded: the grant lifts a gate of one of the live locks.
func (v *View) Lifting(pod *corev1.Pod) bool {
	return slices.ContainsFunc(v.LocksIn(pod.Namespace), func(l *locksv1.DistributedLock) bool { return v.LiftsGate(l, pod) })
}

// RecordsLift reports whether the lock's status, as written, records the
// pod's grant and the lift of the lock's gate: no gate is lifted before
// that record. A grant the status could not record (it still names another
// pod's grant that is not seen to be over) waits.
func RecordsLift(l *locksv1.DistributedLock, pod *corev1.Pod) bool {
	g := l.Status.Grant
	return g != nil && g.PodUID == string(pod.UID) && g.GateLifted
}

// HeldBy is the Redis holder that is the pod, if any.
func (v *View) HeldBy(uid types.UID) (Holder, bool) {
	for _, h := range v.Holders {
		if h.PodUID == uid {
			return h, true
		}
	}
	return Holder{}, false
}

// HolderPod is the pod holding the key in Redis, if it is in the view.
func (v *View) HolderPod() *corev1.Pod {
	if len(v.Holders) == 0 {
		return nil
	}
	return v.Holders[0].Pod
}

// LocksIn are the view's live locks in the namespace.
func (v *View) LocksIn(namespace string) []*locksv1.DistributedLock {
	return InNamespace(v.Locks, namespace)
}

// DeletingIn are the view's locks in the namespace being deleted.
func (v *View) DeletingIn(namespace string) []*locksv1.DistributedLock {
	return InNamespace(v.Deleting, namespace)
}

// SelectorsOf are the view's live locks that select the pod.
func (v *View) SelectorsOf(pod *corev1.Pod) []*locksv1.DistributedLock {
	var out []*locksv1.DistributedLock
	for _, l := range v.LocksIn(pod.Namespace) {
		if v.Selects(l, pod) {
			out = append(out, l)
		}
	}
	return out
}

// Guards reports whether a live lock in mode Grant gates the pod: only a
// grant lifts a gate.
func (v *View) Guards(pod *corev1.Pod) bool {
	return slices.ContainsFunc(v.LocksIn(pod.Namespace), func(l *locksv1.DistributedLock) bool {
		return GrantsFor(l) && HasGate(pod, locksv1.GateFor(l.Name))
	})
}

// GatedByAny reports whether a live lock gates the pod.
func (v *View) GatedByAny(pod *corev1.Pod) bool {
	return slices.ContainsFunc(v.LocksIn(pod.Namespace), func(l *locksv1.DistributedLock) bool {
		return HasGate(pod, locksv1.GateFor(l.Name))
	})
}

// InNamespace are the locks of the namespace.
func InNamespace(locks []*locksv1.DistributedLock, namespace string) []*locksv1.DistributedLock {
	var out []*locksv1.DistributedLock
	for _, l := range locks {
		if l.Namespace == namespace {
			out = append(out, l)
		}
	}
	return out
}

// GrantsFor reports whether the controller takes the lock for its
// candidates (mode Grant), rather than leaving it to them (mode Observe).
func GrantsFor(lock *locksv1.DistributedLock) bool { return !lock.Spec.Observes() }

// HasGate reports whether the pod carries the scheduling gate.
func HasGate(pod *corev1.Pod, gate string) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == gate })
}

// MarkedBy reports whether the pod carries the lock's holder marks (its
// owner annotation or holder label).
func MarkedBy(pod *corev1.Pod, lock string) bool {
	_, ok := pod.Annotations[locksv1.OwnerAnnotationPrefix+lock]
	return ok || pod.Labels[locksv1.HolderLabelFor(lock)] != ""
}
