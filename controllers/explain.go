package controllers

import (
	"context"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
)

// No pod waits unexplained: a pod behind a lockwarden gate is told, in
// Events of its own, where it stands. A pod whose gate no lock can lift is
// told by the gate checker (gates.go); the others here.

// toldPods are, by key, the pods told where they stand, with what they were
// told: each is told once, and again only when that changes. Only the
// key's reconcile, one at a time, reads or writes its entry, which holds
// the pods waiting for the key now and nothing else.
type toldPods struct{ m sync.Map } // string -> map[types.UID]string

// tellGranted tells the pod, and the locks of its namespace, that it was
// granted the key (once the grant is recorded), and the pod which locks it
// still waits for before it can start.
func (r *DistributedLockReconciler) tellGranted(s *scope, pod *corev1.Pod, token int64) {
	r.eventf(s, pod.Namespace, corev1.EventTypeNormal, "Acquired", "Granted %s to pod %s with fencing token %d", s.Key, pod.Name, token)
	for _, l := range s.LocksIn(pod.Namespace) {
		r.Metrics.transition(l, "acquired")
	}
	var others []string
	for _, g := range pod.Spec.SchedulingGates {
		name, ours := strings.CutPrefix(g.Name, locksv1.GatePrefix)
		if ours && s.lockNamed(pod.Namespace, name) == nil {
			others = append(others, name)
		}
	}
	msg := fmt.Sprintf("Granted %s with fencing token %d", s.Key, token)
	if len(others) > 0 {
		msg += fmt.Sprintf("; it holds it while it waits for lock %s before it can start", strings.Join(others, ", "))
	}
	r.Recorder.Event(pod, corev1.EventTypeNormal, "Granted", msg)
}

// tellWaiting tells each guarded pod waiting for the key its place in the
// order, and each blocked one what holds it back: another lock it takes
// first, or another controller's gate. Each is an announcement about the
// locks of the pod's namespace, and remembered as told once it is sent.
func (r *DistributedLockReconciler) tellWaiting(ctx context.Context, s *scope, waiting []*corev1.Pod, blocked map[*corev1.Pod]string) {
	before, _ := r.told.m.Load(s.Key)
	told, _ := before.(map[types.UID]string)
	now := map[types.UID]string{}
	pending := 0
	tell := func(p *corev1.Pod, what, eventType, reason, message string) {
		if what == told[p.UID] {
			now[p.UID] = what
			return
		}
		pending++
		s.announce(announcement{about: s.LocksIn(p.Namespace), object: p, eventType: eventType, reason: reason, message: message,
			sent: func() { now[p.UID] = what }})
	}
	// Places count only the pod's own namespace's waiting pods: another
	// namespace's are none of its business.
	guarded, place := map[string]int{}, map[string]int{}
	for _, p := range waiting {
		if s.GatedByAny(p) {
			guarded[p.Namespace]++
		}
	}
	for _, p := range waiting {
		if !s.GatedByAny(p) {
			continue
		}
		if s.notALock {
			// Nothing is granted: the pod has no place in a line.
			tell(p, keyInUse.reason, corev1.EventTypeWarning, keyInUse.reason, fmt.Sprintf("Waiting for %s: %s", s.Key, keyInUse.message))
			continue
		}
		place[p.Namespace]++
		tell(p, "queued", corev1.EventTypeNormal, "Queued", fmt.Sprintf("Waiting for %s: place %d of %d", s.Key, place[p.Namespace], guarded[p.Namespace]))
	}
	for p, why := range blocked {
		if _, problems, err := s.gateLocksOf(ctx, r, p); err != nil || len(problems) > 0 {
			continue // the gate checker tells it
		}
		tell(p, why, corev1.EventTypeNormal, "Waiting", fmt.Sprintf("Waiting for %s: %s", s.Key, why))
	}
	// The memory holds the pods waiting now, told already; an announcement
	// sent later in this reconcile adds its pod (only this key's reconcile,
	// one at a time, touches the map).
	if len(now) > 0 || pending > 0 {
		r.told.m.Store(s.Key, now)
	} else {
		r.told.m.Delete(s.Key)
	}
}

// tellUnguarded warns, once, about each pod that names a lock of the key in
// mode Grant (its label lockwarden.dev/lock or annotation
// lockwarden.dev/locks) but carries no gate of it and no lock records
// lifting one from it: the gating policy did not gate it at its creation
// (not installed yet, or a cluster without MutatingAdmissionPolicy), so it
// is an unguarded candidate that may run without holding the lock. A
// Warning Event goes to the pod and to the lock.
func (r *DistributedLockReconciler) tellUnguarded(s *scope) {
	before, _ := r.unguardedWarned.Load(s.Key)
	warned, _ := before.(map[types.UID]bool)
	now := map[types.UID]bool{}
	for _, p := range s.pods {
		if !s.MayUse[p.Namespace] || decide.Stopped(p) || s.LiftedFor(p) {
			continue
		}
		for _, name := range locksv1.NamedLocks(p.Labels, p.Annotations) {
			l := s.lockNamed(p.Namespace, name)
			if l == nil || !decide.GrantsFor(l) || decide.HasGate(p, locksv1.GateFor(name)) {
				continue
			}
			now[p.UID] = true
			if !warned[p.UID] {
				msg := fmt.Sprintf("Pod %s names lock %s but carries no gate of it: the gating admission policy did not gate it when it was created (not installed yet, or a cluster without MutatingAdmissionPolicy), so it may run without holding the lock; recreate it once the policy is active", p.Name, name)
				r.Recorder.Event(p, corev1.EventTypeWarning, "NotGuarded", msg)
				r.Recorder.Event(l, corev1.EventTypeWarning, "NotGuarded", msg)
			}
			break
		}
	}
	if len(now) > 0 {
		r.unguardedWarned.Store(s.Key, now)
	} else if warned != nil {
		r.unguardedWarned.Delete(s.Key)
	}
}

// lockNamed is the live lock of the key with the name in the namespace, or
// nil.
func (s *scope) lockNamed(namespace, name string) *locksv1.DistributedLock {
	for _, l := range s.LocksIn(namespace) {
		if l.Name == name {
			return l
		}
	}
	return nil
}
