package controllers

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// failure is why a phase of a reconcile failed, as the key's locks show it
// in their Ready condition until a reconcile succeeds: a failed write is a
// reason on the status, never a status left unwritten.
type failure struct {
	reason, message string
	// refused is the pod or lock whose update the API server refused,
	// named only to the locks of its namespace; a pod is told with an
	// Event too.
	refused client.Object
}

// updateRefused is the API server's refusal of the manager's update of a
// pod (its marks and gates) or of a lock (its finalizer): another tool's
// webhook, a policy engine, a quota.
type updateRefused struct {
	object client.Object
	err    error
}

func (e *updateRefused) Error() string {
	return fmt.Sprintf("update of %s %s/%s: %v", kindOf(e.object), e.object.GetNamespace(), e.object.GetName(), e.err)
}

func (e *updateRefused) Unwrap() error { return e.err }

// kindOf is "pod" or "lock".
func kindOf(obj client.Object) string {
	if _, ok := obj.(*corev1.Pod); ok {
		return "pod"
	}
	return "lock"
}

// keyInUse is the Ready condition of the locks of a key that holds data that
// is not a lock.
var keyInUse = condition{"KeyInUse", "the Redis key holds data that is not a lock, so nothing is granted; choose another spec.key"}

// failureOf is how the locks show that the phase failed with err, or nil
// for a write that lost a race with another writer (an object changed, or
// a lock deleted, since it was read): that is ordinary, retried at once,
// and the status computed from the read is shown as it is.
func failureOf(phase string, err error) *failure {
	var refused *updateRefused
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err) && errors.As(err, &refused) && kindOf(refused.object) == "lock":
		return nil // a lock deleted since it was read is no failure either
	case errors.As(err, &refused) && kindOf(refused.object) == "lock":
		return &failure{reason: "LockUpdateRefused", refused: refused.object, message: fmt.Sprintf(
			"the API server refused the manager's update of lock %s, to add the finalizer that releases what it grants once it is deleted (%s): nothing is granted until it accepts one; another admission webhook or policy may refuse the manager's writes",
			refused.object.GetName(), apierrors.ReasonForError(refused.err))}
	case errors.As(err, &refused):
		return &failure{reason: "PodUpdateRefused", refused: refused.object, message: fmt.Sprintf(
			"the API server refused the manager's update of pod %s, which holds the key: its marks are not written and its gate is not lifted until it accepts one (%s); another admission webhook or policy may refuse the manager's writes",
			refused.object.GetName(), apierrors.ReasonForError(refused.err))}
	}
	return &failure{reason: "ReconcileFailed", message: fmt.Sprintf(
		"%s failed; it is retried, and the manager's log has the error", phase)}
}

// messageFor is the failure's message as the locks of the namespace read
// it: another namespace's pod or lock is not named.
func (f *failure) messageFor(namespace string) string {
	switch {
	case f.refused == nil || f.refused.GetNamespace() == namespace:
		return f.message
	case kindOf(f.refused) == "pod":
		return "the API server refused the manager's update of the pod that holds the key, in another namespace; nothing is granted until it accepts one"
	}
	return "the API server refused the manager's update of another namespace's lock of the key; nothing is granted until it accepts one"
}

// announceFailure announces one Warning Event for the failure on each lock
// of the key whose Ready condition did not already show it, and on the pod
// it concerns when one of its namespace's locks is told.
func (s *scope) announceFailure() {
	f := s.failed
	if f == nil {
		return
	}
	toldPod := false
	for _, l := range s.Locks {
		was := meta.FindStatusCondition(s.before[client.ObjectKeyFromObject(l)].Status.Conditions, locksv1.ConditionReady)
		if was != nil && was.Reason == f.reason {
			continue
		}
		about := []*locksv1.DistributedLock{l}
		s.announce(announcement{about: about, object: l, eventType: corev1.EventTypeWarning, reason: f.reason, message: f.messageFor(l.Namespace)})
		if pod, ok := f.refused.(*corev1.Pod); ok && pod.Namespace == l.Namespace && !toldPod {
			toldPod = true
			s.announce(announcement{about: about, object: pod, eventType: corev1.EventTypeWarning, reason: f.reason, message: f.message})
		}
	}
}
