package controllers

import (
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// CacheOptions are the manager's cache settings for this controller. It
// watches the pods of the cluster, so each is kept stripped to the fields
// the controller reads (see stripPod), and no object keeps its
// managedFields. The manager and the tests start their cache with these.
//
// pods, if not nil, is the opt-in filter of the manager's
// --pod-label-selector: only the pods it selects are watched and cached, so
// the manager's memory follows the pods that take part in locks, not every
// pod of the cluster. The controller then never sees any other pod: a pod a
// lock selects or gates must carry the label to be granted anything, and
// an in-pod client's hold is released when its pod stops only if its pod
// carries it too.
func CacheOptions(pods labels.Selector) cache.Options {
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject:         map[client.Object]cache.ByObject{&corev1.Pod{}: {Label: pods, Transform: stripPod}},
	}
}

// stripPod keeps what the controller reads of a pod: its identity, labels,
// lockwarden's own annotations, and timestamps; its scheduling gates, node,
// and its containers' names (and init containers' restart policies, which
// make native sidecars); its phase, and of its conditions (see
// stripConditions) and container statuses the states, restart counts,
// reasons and times. The rest, above all the container specs and volumes,
// other tools' annotations and the status messages, is most of a pod's
// size. The kept conditions, containers and statuses are fresh copies; the
// labels and gates are kept as decoded, each its own allocation, so nothing
// of the rest of the decoded object stays alive behind them. The controller
// only ever writes a pod with a merge patch of its labels, own annotations
// and gates computed between two such stripped copies, so what is dropped
// is never written.
func stripPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	// A stripped pod's containers have no image, which the API requires of
	// every pod. client-go transforms the objects of an informer's initial
	// watch-list twice (into a temporary store, then again as they replace
	// the cache's), and a second copy of every pod, alive until the first
	// is dropped, made the cache's start-up the manager's peak of memory.
	if len(pod.Spec.Containers) == 0 || pod.Spec.Containers[0].Image == "" {
		return pod, nil
	}
	stripped := &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			Generation: pod.Generation, CreationTimestamp: pod.CreationTimestamp,
			DeletionTimestamp: pod.DeletionTimestamp, DeletionGracePeriodSeconds: pod.DeletionGracePeriodSeconds,
			Labels: pod.Labels, Annotations: ownAnnotations(pod.Annotations),
		},
		Spec: corev1.PodSpec{
			NodeName: pod.Spec.NodeName, SchedulingGates: pod.Spec.SchedulingGates,
			InitContainers: stripContainers(pod.Spec.InitContainers), Containers: stripContainers(pod.Spec.Containers),
			EphemeralContainers: stripEphemeral(pod.Spec.EphemeralContainers),
		},
		Status: corev1.PodStatus{
			ObservedGeneration:         pod.Status.ObservedGeneration,
			Phase:                      pod.Status.Phase,
			Conditions:                 stripConditions(pod.Status.Conditions),
			InitContainerStatuses:      stripContainerStatuses(pod.Status.InitContainerStatuses),
			ContainerStatuses:          stripContainerStatuses(pod.Status.ContainerStatuses),
			EphemeralContainerStatuses: stripContainerStatuses(pod.Status.EphemeralContainerStatuses),
		},
	}
	return stripped, nil
}

// stripEphemeral keeps each ephemeral container's name.
func stripEphemeral(in []corev1.EphemeralContainer) []corev1.EphemeralContainer {
	if in == nil {
		return nil
	}
	out := make([]corev1.EphemeralContainer, len(in))
	for i, c := range in {
		out[i].Name = c.Name
	}
	return out
}

// stripContainers keeps each container's name and restart policy: an init
// container with restartPolicy Always is a native sidecar.
func stripContainers(in []corev1.Container) []corev1.Container {
	if in == nil {
		return nil
	}
	out := make([]corev1.Container, len(in))
	for i, c := range in {
		out[i] = corev1.Container{Name: c.Name, RestartPolicy: c.RestartPolicy}
	}
	return out
}

// ownAnnotations are the annotations lockwarden writes, and the one by
// which a pod names the locks it waits for, nil if none.
func ownAnnotations(in map[string]string) map[string]string {
	var out map[string]string
	for k, v := range in {
		if isOwnMark(k) || k == locksv1.LocksAnnotation {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// stripConditions keeps the conditions the controller reads: a false
// PodScheduled condition, whose reason says why a pod is not scheduled,
// and the one that changed last, whose time is when a stopped pod stopped
// (stopTime). A running pod keeps one.
func stripConditions(in []corev1.PodCondition) []corev1.PodCondition {
	var out []corev1.PodCondition
	keep := func(c corev1.PodCondition) {
		out = append(out, corev1.PodCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, LastTransitionTime: c.LastTransitionTime})
	}
	latest := -1
	for i, c := range in {
		if latest < 0 || c.LastTransitionTime.After(in[latest].LastTransitionTime.Time) {
			latest = i
		}
	}
	for i, c := range in {
		if (c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse) || i == latest {
			keep(c)
		}
	}
	return out
}

func stripContainerStatuses(in []corev1.ContainerStatus) []corev1.ContainerStatus {
	if in == nil {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(in))
	for i, cs := range in {
		out[i] = corev1.ContainerStatus{Name: cs.Name, RestartCount: cs.RestartCount,
			State: stripState(cs.State), LastTerminationState: stripState(cs.LastTerminationState)}
	}
	return out
}

func stripState(in corev1.ContainerState) corev1.ContainerState {
	var state corev1.ContainerState
	if w := in.Waiting; w != nil {
		state.Waiting = &corev1.ContainerStateWaiting{Reason: w.Reason}
	}
	if r := in.Running; r != nil {
		state.Running = &corev1.ContainerStateRunning{StartedAt: r.StartedAt}
	}
	if t := in.Terminated; t != nil {
		state.Terminated = &corev1.ContainerStateTerminated{ExitCode: t.ExitCode, Reason: t.Reason, StartedAt: t.StartedAt, FinishedAt: t.FinishedAt}
	}
	return state
}

// ignoreOwnMarks drops pod updates that only set or change lockwarden's own
// labels and annotations: the controller wrote them in a reconcile that saw
// everything they say, so waking it again would only repeat that work. An
// update that removes a mark still wakes it: the marks are how a grant is
// found again after Redis lost it, so one removed by someone else must be
// written back. A gate lifted, a phase or a container state changed, a
// deletion started: all of these wake it too.
var ignoreOwnMarks = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		before, ok1 := e.ObjectOld.(*corev1.Pod)
		after, ok2 := e.ObjectNew.(*corev1.Pod)
		if !ok1 || !ok2 {
			return true
		}
		return marksRemoved(before.Labels, after.Labels) || marksRemoved(before.Annotations, after.Annotations) ||
			!equality.Semantic.DeepEqual(withoutOwnMarks(before), withoutOwnMarks(after))
	},
}

// marksRemoved reports whether a mark in before is missing from after.
func marksRemoved(before, after map[string]string) bool {
	for k := range before {
		if _, kept := after[k]; !kept && isOwnMark(k) {
			return true
		}
	}
	return false
}

func isOwnMark(key string) bool {
	for _, prefix := range ownMarkPrefixes {
		if strings.HasPrefix(key, prefix) {
			return true
		}
	}
	return false
}

// ownMarkPrefixes are the prefixes of the labels and annotations lockwarden
// writes on pods.
var ownMarkPrefixes = append([]string{locksv1.HolderLabelPrefix}, locksv1.MarkAnnotationPrefixes...)

func withoutOwnMarks(pod *corev1.Pod) *corev1.Pod {
	p := pod.DeepCopy()
	p.ResourceVersion, p.ManagedFields = "", nil
	for _, m := range []map[string]string{p.Labels, p.Annotations} {
		for k := range m {
			if isOwnMark(k) {
				delete(m, k)
			}
		}
	}
	return p
}

// selectors caches each lock's parsed candidate selector (for a lock without
// spec.candidates, the label naming it), by lock, for as
// long as its UID and generation stay the same: selectsIndex, every
// reconcile and every pod event that may concern the lock need it, and
// parsing a selector allocates.
var selectors selectorCache

type selectorCache struct{ m sync.Map } // types.NamespacedName -> parsedSelector

type parsedSelector struct {
	uid        types.UID
	generation int64
	selector   labels.Selector // nil if the selector is invalid or empty
}

func (c *selectorCache) get(lock *locksv1.DistributedLock) labels.Selector {
	name := types.NamespacedName{Namespace: lock.Namespace, Name: lock.Name}
	if v, ok := c.m.Load(name); ok {
		if p := v.(parsedSelector); p.uid == lock.UID && p.generation == lock.Generation {
			return p.selector
		}
	}
	p := parsedSelector{uid: lock.UID, generation: lock.Generation}
	candidates := &metav1.LabelSelector{MatchLabels: map[string]string{locksv1.LockLabel: lock.Name}}
	if lock.Spec.Candidates != nil {
		candidates = lock.Spec.Candidates.LabelSelector()
	}
	if s, err := metav1.LabelSelectorAsSelector(candidates); err == nil && !s.Empty() {
		p.selector = s
	}
	c.m.Store(name, p)
	return p.selector
}

// OnDelete drops a deleted lock's entry. It is an event handler of the
// lock informer, which every replica runs: selectsIndex parses selectors
// on standbys too, and they never reconcile. A lock created again under the
// same name keeps the entry of its new UID.
func (c *selectorCache) OnDelete(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	lock, ok := obj.(*locksv1.DistributedLock)
	if !ok {
		return
	}
	name := types.NamespacedName{Namespace: lock.Namespace, Name: lock.Name}
	if v, ok := c.m.Load(name); ok && v.(parsedSelector).uid == lock.UID {
		c.m.Delete(name)
	}
}

// OnAdd and OnUpdate have nothing to do: get parses on first use.
func (c *selectorCache) OnAdd(any, bool)   {}
func (c *selectorCache) OnUpdate(_, _ any) {}
