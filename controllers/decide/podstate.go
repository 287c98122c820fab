package decide

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// What the kubelet says of a pod, read the way the kubelet means it. The
// kubelet restarts a container that exits under restartPolicy OnFailure
// (with a non-zero code) or Always, in the same pod, and the phase stays
// Running meanwhile: a pod whose containers have all exited may well run
// again. Only a terminal phase, the object gone, or a deletion that has
// terminated every container says it never will.

// Stopped reports whether the pod's containers can never run again: its
// phase is Succeeded or Failed; or it is being deleted, its kubelet has
// reported a status for the deletion (status.observedGeneration has reached
// the generation the deletion gave the pod), and every container (init,
// native sidecar, app and ephemeral) has terminated; or it is being deleted
// before it was ever bound to a node. A deletion timestamp alone is not
// enough: the containers run on through the grace period. Nor is every
// container terminated while the pod lives: the kubelet may restart them,
// and until it has seen the deletion it goes on doing so; a status written
// before, or by a kubelet cut off since, says nothing of after. (Kubelets
// before 1.35 report no observedGeneration: their pods stop at their
// terminal phase, which kubelets since 1.27 set on a deleted pod, or once
// gone.) A pod that is gone has stopped too; callers see it as missing.
// Stopped is final: no kubelet starts a container of a pod in a terminal
// phase, nor of one it is deleting.
func Stopped(pod *corev1.Pod) bool {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return true
	}
	if pod.DeletionTimestamp.IsZero() {
		return false
	}
	if pod.Spec.NodeName == "" && len(pod.Status.ContainerStatuses) == 0 && len(pod.Status.InitContainerStatuses) == 0 {
		return true // never bound, and the scheduler binds no pod being deleted
	}
	if pod.Status.ObservedGeneration < pod.Generation {
		return false // its kubelet has not reported on the deletion
	}
	ephemeral := make([]corev1.Container, len(pod.Spec.EphemeralContainers))
	for i, c := range pod.Spec.EphemeralContainers {
		ephemeral[i] = corev1.Container{Name: c.Name}
	}
	return allTerminated(pod.Spec.InitContainers, pod.Status.InitContainerStatuses) &&
		allTerminated(pod.Spec.Containers, pod.Status.ContainerStatuses) &&
		allTerminated(ephemeral, pod.Status.EphemeralContainerStatuses)
}

// allTerminated reports whether every container has a terminated status.
// A container without a status has not been reported on, so it may run.
func allTerminated(containers []corev1.Container, statuses []corev1.ContainerStatus) bool {
	for _, c := range containers {
		if cs := statusOf(c.Name, statuses); cs == nil || cs.State.Terminated == nil {
			return false
		}
	}
	return true
}

func statusOf(name string, statuses []corev1.ContainerStatus) *corev1.ContainerStatus {
	for i := range statuses {
		if statuses[i].Name == name {
			return &statuses[i]
		}
	}
	return nil
}

// Started reports whether the pod has started: it carries no scheduling
// gate, and every app container has run at least once. A container that
// ran and then completed, or crashed and waits to be restarted (its
// restart count above zero, whether or not the kubelet still reports its
// last state), has started; the pod is never "not started" again. A pod
// still behind a gate (one waiting for its next lock) has not started: it
// is waiting.
func Started(pod *corev1.Pod) bool {
	if len(pod.Spec.SchedulingGates) > 0 || len(pod.Spec.Containers) == 0 {
		return false
	}
	for _, c := range pod.Spec.Containers {
		cs := statusOf(c.Name, pod.Status.ContainerStatuses)
		if cs == nil || !(cs.State.Running != nil || cs.RestartCount > 0 || ran(cs.State.Terminated) || ran(cs.LastTerminationState.Terminated)) {
			return false
		}
	}
	return true
}

// ran reports whether a terminated container had started: one that could
// not start at all (a bad command, say) ends without a start time.
func ran(t *corev1.ContainerStateTerminated) bool {
	return t != nil && !t.StartedAt.IsZero()
}

// Restarting names a container of the pod that waits to be restarted after
// it exited (a crash loop), with the kubelet's reason, or "".
func Restarting(pod *corev1.Pod) string {
	for _, cs := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && (ran(cs.LastTerminationState.Terminated) || cs.RestartCount > 0) {
			return cs.Name + ": " + w.Reason
		}
	}
	return ""
}

// WhyNotStarted says, from the pod's status, what keeps it from running.
func WhyNotStarted(pod *corev1.Pod) string {
	for _, cs := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			return w.Reason
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason != "" {
			return c.Reason
		}
	}
	if pod.Spec.NodeName == "" {
		return "not scheduled yet"
	}
	return "phase " + string(pod.Status.Phase)
}

// LastMarked is when the pod was last marked as a lock's holder: for a
// pod whose gates are all lifted, about when the last of them went and it
// was free to start. Zero if no mark says so.
func LastMarked(pod *corev1.Pod) time.Time {
	var latest time.Time
	for k := range pod.Annotations {
		if lock, ok := strings.CutPrefix(k, locksv1.SinceAnnotationPrefix); ok {
			if t := MarkedAt(pod, lock); t.After(latest) {
				latest = t
			}
		}
	}
	return latest
}

// MarkedAt is when the pod was marked as the lock's holder for its present
// ownership, zero if the mark is missing or unreadable.
func MarkedAt(pod *corev1.Pod, lock string) time.Time {
	t, _ := time.Parse(time.RFC3339, pod.Annotations[locksv1.SinceAnnotationPrefix+lock])
	return t
}

// StopTime is when the pod stopped, as far as the API shows: the last
// container's end, or the last condition's change.
func StopTime(pod *corev1.Pod) time.Time {
	var latest time.Time
	for _, cs := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if t := cs.State.Terminated; t != nil && t.FinishedAt.After(latest) {
			latest = t.FinishedAt.Time
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.LastTransitionTime.After(latest) {
			latest = c.LastTransitionTime.Time
		}
	}
	if latest.IsZero() {
		return time.Now()
	}
	return latest
}

// OurGates splits the pod's scheduling gates into lockwarden's (by lock
// name) and everyone else's.
func OurGates(pod *corev1.Pod) (locks []string, foreign []string) {
	return locksv1.SplitGates(pod.Spec.SchedulingGates)
}
