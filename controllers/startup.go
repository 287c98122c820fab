package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
)

// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create

// defaultStartTimeout is the API's default for spec.startTimeout.
const defaultStartTimeout = 5 * time.Minute

// evictionRetry is how soon an eviction a PodDisruptionBudget refused is
// tried again: kubectl drain's interval.
const evictionRetry = 5 * time.Second

// watchStartup shows a holder the controller granted the lock to that has
// not started within the startTimeout of its policy lock (View.PolicyLock: the
// lock that lifted its gate, gates or selects it), counted from when its
// last gate was lifted, and decides to evict it if that lock opts in
// (evict); the lock is released once the pod is gone. Another lock naming
// the same key sets neither: its policy is for its own pods. A holder
// still behind a gate (waiting for its next lock) is waiting, not late. One that started and then crash-loops is
// reported as such, never as not started. Until the deadline, it asks for
// a look at the key when it falls.
func (r *DistributedLockReconciler) watchStartup(ctx context.Context, s *scope) ([]action, error) {
	var out []action
	pod := s.HolderPod()
	for _, l := range s.Locks {
		if pod == nil || pod.Namespace != l.Namespace || !s.Holders[0].ByController() || decide.Stopped(pod) {
			meta.RemoveStatusCondition(&l.Status.Conditions, locksv1.ConditionHolderStarted)
			continue
		}
		// A gate no lock can lift any more (its lock deleted, or no longer
		// selecting the pod) keeps the pod from starting for good: that is
		// late, not waiting.
		_, problems, err := r.gateLocks(ctx, pod)
		if err != nil {
			return nil, err
		}
		if gates := pod.Spec.SchedulingGates; len(gates) > 0 && len(problems) == 0 {
			var names []string
			for _, g := range gates {
				names = append(names, g.Name)
			}
			setCondition(l, locksv1.ConditionHolderStarted, metav1.ConditionUnknown, "WaitingForGates",
				fmt.Sprintf("%s holds the lock and waits behind its other scheduling gates: %s", pod.Name, strings.Join(names, ", ")))
			continue
		}
		if decide.Started(pod) {
			s.reportRestarts(l, pod)
			continue
		}
		why := decide.WhyNotStarted(pod)
		if len(problems) > 0 {
			why = problems[0].message
		}
		policy := s.PolicyLock(pod)
		timeout := defaultStartTimeout
		if policy != nil && policy.Spec.StartTimeout != nil {
			timeout = policy.Spec.StartTimeout.Duration
		}
		since := decide.LastMarked(pod)
		if since.IsZero() {
			since = time.Now()
		}
		if wait := time.Until(since.Add(timeout)); wait > 0 {
			setCondition(l, locksv1.ConditionHolderStarted, metav1.ConditionUnknown, "Starting",
				fmt.Sprintf("%s was granted the lock and has not started yet: %s", pod.Name, why))
			s.requeue(wait)
			continue
		}
		// The message names the bound, not the time elapsed, so it stays
		// the same and the status is not rewritten on every reconcile.
		msg := fmt.Sprintf("%s has not started for %s: %s", pod.Name, shortDuration(timeout), why)
		was := meta.FindStatusCondition(s.before[client.ObjectKeyFromObject(l)].Status.Conditions, locksv1.ConditionHolderStarted)
		if was == nil || was.Reason != "NotStarted" {
			s.announce(announcement{about: []*locksv1.DistributedLock{l}, object: l, eventType: corev1.EventTypeWarning, reason: "NotStarted", message: msg})
		}
		setCondition(l, locksv1.ConditionHolderStarted, metav1.ConditionFalse, "NotStarted", msg)
		if l == policy && l.Spec.DeleteUnstarted && pod.DeletionTimestamp.IsZero() {
			out = append(out, evict{lock: l, pod: pod, timeout: timeout})
		}
	}
	return out, nil
}

// reportRestarts shows a holder that started: HolderStarted is True, with
// the reason Restarting while a container waits to be restarted (a crash
// loop), which a Warning Event tells once. It is never evicted for it: it
// started, and a restart in place keeps the lock.
func (s *scope) reportRestarts(l *locksv1.DistributedLock, pod *corev1.Pod) {
	which := decide.Restarting(pod)
	if which == "" {
		setCondition(l, locksv1.ConditionHolderStarted, metav1.ConditionTrue, "Started", pod.Name+" has started")
		return
	}
	msg := fmt.Sprintf("%s has started, and a container waits to be restarted in place (%s); it keeps the lock meanwhile", pod.Name, which)
	was := meta.FindStatusCondition(s.before[client.ObjectKeyFromObject(l)].Status.Conditions, locksv1.ConditionHolderStarted)
	if was == nil || was.Reason != "Restarting" {
		s.announce(announcement{about: []*locksv1.DistributedLock{l}, object: l, eventType: corev1.EventTypeWarning, reason: "HolderRestarting", message: msg})
	}
	setCondition(l, locksv1.ConditionHolderStarted, metav1.ConditionTrue, "Restarting", msg)
}

// shortDuration prints 5m rather than 5m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
