package controllers

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// holder is an owner of the lock in Redis, mapped to a pod when its owner ID
// starts with the UID of a pod this cluster has.
type holder struct {
	owner  redislock.Owner
	podUID types.UID
	pod    *corev1.Pod // nil if no such pod is known here
	token  int64
}

func (h holder) grantedByController() bool {
	return strings.HasSuffix(string(h.owner), ":"+strconv.Itoa(controllerOwnerN))
}

// candidates lists the pods the lock's selector picks, oldest first: the
// order in which they are granted the lock.
func (r *DistributedLockReconciler) candidates(ctx context.Context, lock *locksv1.DistributedLock) ([]corev1.Pod, error) {
	selector, err := metav1.LabelSelectorAsSelector(lock.Spec.Candidates.LabelSelector())
	if err != nil {
		return nil, err // admission validates selectors, so this is unexpected
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(lock.Namespace), client.MatchingLabelsSelector{Selector: selector}); err != nil {
		return nil, err
	}
	slices.SortFunc(pods.Items, func(a, b corev1.Pod) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return pods.Items, nil
}

// resolveHolders maps the lock's owners in Redis to pods, by pod UID.
func (r *DistributedLockReconciler) resolveHolders(ctx context.Context, lock *locksv1.DistributedLock, info redislock.LockInfo) ([]holder, error) {
	var holders []holder
	for _, h := range info.Holders {
		owner := string(h.Owner)
		uid := types.UID(owner[:max(strings.LastIndexByte(owner, ':'), 0)])
		pod, err := r.podByUID(ctx, uid)
		if err != nil {
			return nil, err
		}
		holders = append(holders, holder{owner: h.Owner, podUID: uid, pod: pod, token: info.Token})
	}
	return holders, nil
}

func (r *DistributedLockReconciler) podByUID(ctx context.Context, uid types.UID) (*corev1.Pod, error) {
	if uid == "" {
		return nil, nil
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.MatchingFields{podUIDIndex: string(uid)}); err != nil {
		return nil, err
	}
	if len(pods.Items) == 0 {
		return nil, nil
	}
	return &pods.Items[0], nil
}

// releaseTerminated force-releases holders whose pod terminated, whether the
// controller granted them the lock or they took it with an in-pod client. A
// holder whose pod the status names but the cluster no longer has was
// deleted. Holders never mapped to a pod here (another cluster's, a plain
// client's) are left alone. It returns the holders that remain.
func (r *DistributedLockReconciler) releaseTerminated(ctx context.Context, lock *locksv1.DistributedLock, locks *redislock.Client, holders []holder) ([]holder, error) {
	var remaining []holder
	nn := client.ObjectKeyFromObject(lock)
	r.mu.Lock()
	granted := r.held[nn]
	r.mu.Unlock()
	for _, h := range holders {
		// A pod this cluster had: named in the status, or granted the lock
		// by this controller even if the status never recorded it.
		inStatus := lock.Status.Holder != nil && lock.Status.Holder.PodName != "" && types.UID(lock.Status.Holder.PodUID) == h.podUID
		gone := h.pod == nil && (inStatus || (granted != nil && granted.podUID == h.podUID))
		if !gone && (h.pod == nil || !terminated(h.pod)) {
			remaining = append(remaining, h)
			continue
		}
		if _, err := locks.ForceRelease(ctx, lock.Status.Key, string(h.podUID)); err != nil {
			return nil, err
		}
		r.forget(nn)
		podName := string(h.podUID)
		if inStatus {
			podName = lock.Status.Holder.PodName
		}
		how := "was deleted"
		if h.pod != nil {
			how = terminationReason(h.pod)
			r.Metrics.observeRelease(time.Since(terminationTime(h.pod)))
		}
		log.FromContext(ctx).Info("released the lock of a terminated pod", "pod", podName, "owner", h.owner)
		r.Recorder.Eventf(lock, corev1.EventTypeNormal, "HolderTerminated", "Released %s: holder pod %s %s", lock.Status.Key, podName, how)
		r.Metrics.transition(lock, "holder_terminated")
	}
	return remaining, nil
}

// grantNext gives the free lock to the first eligible candidate, holding it
// in Redis under the owner ID "<pod UID>:0".
func (r *DistributedLockReconciler) grantNext(ctx context.Context, lock *locksv1.DistributedLock, locks *redislock.Client, pods []corev1.Pod) ([]holder, error) {
	for i := range pods {
		pod := &pods[i]
		if !eligible(pod) {
			continue
		}
		mutex, err := locks.NewMutex(lock.Status.Key, &redislock.MutexOptions{Owner: ownerFor(pod.UID)})
		if err != nil {
			return nil, err
		}
		lease, err := mutex.TryLock(ctx, 0)
		if errors.Is(err, redislock.ErrWaitTimeout) {
			// Taken meanwhile, or reserved for a queued in-pod client.
			info, err := locks.Inspect(ctx, lock.Status.Key)
			if err != nil {
				return nil, err
			}
			return r.resolveHolders(ctx, lock, info)
		}
		if err != nil {
			return nil, err
		}
		r.remember(ctx, lock, &grant{mutex: mutex, lease: lease, podUID: pod.UID})
		r.Recorder.Eventf(lock, corev1.EventTypeNormal, "Acquired", "Granted %s to pod %s with fencing token %d", lock.Status.Key, pod.Name, lease.Token())
		r.Metrics.transition(lock, "acquired")
		return []holder{{owner: ownerFor(pod.UID), podUID: pod.UID, pod: pod, token: lease.Token()}}, nil
	}
	return nil, nil
}

// adopt takes over the renewal of a hold the controller granted before it
// restarted (or another manager replica granted), if its pod is still a live
// candidate here. Re-entering the lock keeps its fencing token.
func (r *DistributedLockReconciler) adopt(ctx context.Context, lock *locksv1.DistributedLock, locks *redislock.Client, h holder) error {
	if !h.grantedByController() || h.pod == nil || h.pod.Namespace != lock.Namespace {
		return nil
	}
	nn := client.ObjectKeyFromObject(lock)
	r.mu.Lock()
	g := r.held[nn]
	r.mu.Unlock()
	if g != nil && g.podUID == h.podUID && g.lease.Err() == nil {
		return nil
	}
	mutex, err := locks.NewMutex(lock.Status.Key, &redislock.MutexOptions{Owner: h.owner})
	if err != nil {
		return err
	}
	lease, err := mutex.TryLock(ctx, 0)
	if errors.Is(err, redislock.ErrWaitTimeout) {
		return nil // lost meanwhile; the next reconcile sees who holds it
	}
	if err != nil {
		return err
	}
	r.remember(ctx, lock, &grant{mutex: mutex, lease: lease, podUID: h.podUID})
	log.FromContext(ctx).Info("adopted a lock held in Redis", "pod", h.pod.Name, "token", lease.Token())
	return nil
}

// checkLost drops a grant whose lease ended without the controller
// releasing it, and reports the loss.
func (r *DistributedLockReconciler) checkLost(ctx context.Context, lock *locksv1.DistributedLock) {
	nn := client.ObjectKeyFromObject(lock)
	r.mu.Lock()
	g := r.held[nn]
	if g != nil && g.lease.Err() != nil {
		delete(r.held, nn)
	}
	r.mu.Unlock()
	if g != nil {
		r.reportLoss(ctx, lock, g)
	}
}

// reportLoss emits the Lost event if g's lease ended other than by the
// controller's own release.
func (r *DistributedLockReconciler) reportLoss(ctx context.Context, lock *locksv1.DistributedLock, g *grant) {
	cause := g.lease.Err()
	if cause == nil || errors.Is(cause, redislock.ErrReleased) {
		return
	}
	log.FromContext(ctx).Info("lost a lock held for a pod", "cause", cause.Error())
	r.Recorder.Eventf(lock, corev1.EventTypeWarning, "Lost", "Lost %s held for pod UID %s: %v", lock.Status.Key, g.podUID, cause)
	r.Metrics.transition(lock, "lost")
}

// remember records a grant and arranges for its loss to trigger a reconcile.
// A grant it replaces may have been lost without a reconcile seeing it yet
// (the lock was freed and granted anew in one pass): that loss is reported.
func (r *DistributedLockReconciler) remember(ctx context.Context, lock *locksv1.DistributedLock, g *grant) {
	nn := client.ObjectKeyFromObject(lock)
	r.mu.Lock()
	replaced := r.held[nn]
	r.held[nn] = g
	r.mu.Unlock()
	if replaced != nil && replaced != g {
		r.reportLoss(ctx, lock, replaced)
	}
	context.AfterFunc(g.lease.Context(), func() {
		if errors.Is(g.lease.Err(), redislock.ErrReleased) {
			return
		}
		obj := &locksv1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name}}
		select {
		case r.lost <- event.GenericEvent{Object: obj}:
		case <-r.stopped:
		}
	})
}

func (r *DistributedLockReconciler) forget(nn types.NamespacedName) {
	r.mu.Lock()
	delete(r.held, nn)
	r.mu.Unlock()
}

// markPods labels and annotates the holder pod, ungates it if the
// controller granted it the lock, and unmarks pods that no longer hold it.
func (r *DistributedLockReconciler) markPods(ctx context.Context, lock *locksv1.DistributedLock, holders []holder) error {
	var holderPod *corev1.Pod
	var h holder
	if len(holders) > 0 && holders[0].pod != nil && holders[0].pod.Namespace == lock.Namespace {
		h = holders[0]
		holderPod = h.pod
	}
	var marked corev1.PodList
	if err := r.List(ctx, &marked, client.InNamespace(lock.Namespace), client.MatchingLabels{locksv1.HolderLabel: lock.Name}); err != nil {
		return err
	}
	for i := range marked.Items {
		pod := &marked.Items[i]
		if holderPod != nil && pod.UID == holderPod.UID {
			continue
		}
		patch := client.MergeFrom(pod.DeepCopy())
		delete(pod.Labels, locksv1.HolderLabel)
		for _, a := range []string{locksv1.LockAnnotation, locksv1.TokenAnnotation, locksv1.SinceAnnotation} {
			delete(pod.Annotations, a)
		}
		if err := client.IgnoreNotFound(r.Patch(ctx, pod, patch)); err != nil {
			return err
		}
	}
	if holderPod == nil || terminated(holderPod) {
		return nil
	}

	pod := holderPod.DeepCopy()
	patch := client.MergeFrom(holderPod)
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	token := strconv.FormatInt(h.token, 10)
	if pod.Annotations[locksv1.TokenAnnotation] != token || pod.Annotations[locksv1.LockAnnotation] != lock.Name {
		pod.Annotations[locksv1.SinceAnnotation] = time.Now().UTC().Format(time.RFC3339)
	}
	pod.Labels[locksv1.HolderLabel] = lock.Name
	pod.Annotations[locksv1.LockAnnotation] = lock.Name
	pod.Annotations[locksv1.TokenAnnotation] = token
	if h.grantedByController() {
		pod.Spec.SchedulingGates = slices.DeleteFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
			return g.Name == locksv1.SchedulingGate
		})
	}
	if equalPodMarks(holderPod, pod) {
		return nil
	}
	return client.IgnoreNotFound(r.Patch(ctx, pod, patch))
}

func equalPodMarks(a, b *corev1.Pod) bool {
	return maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Annotations, b.Annotations) && len(a.Spec.SchedulingGates) == len(b.Spec.SchedulingGates)
}

// updateStatus records the holder, the waiting candidates and the Held
// condition. Since is kept while the ownership stays the same.
func (r *DistributedLockReconciler) updateStatus(lock *locksv1.DistributedLock, holders []holder, pods []corev1.Pod) {
	st := &lock.Status
	var holderUID types.UID
	if len(holders) == 0 {
		st.Holder = nil
		setCondition(lock, locksv1.ConditionHeld, metav1.ConditionFalse, "Free", "Nobody holds the lock")
	} else {
		h := holders[0]
		holderUID = h.podUID
		next := &locksv1.LockHolder{OwnerID: string(h.owner), PodUID: string(h.podUID), GrantedByController: h.grantedByController(), Token: h.token, Since: metav1.Now()}
		if h.pod != nil {
			next.PodName = h.pod.Name
		}
		if st.Holder != nil && st.Holder.OwnerID == next.OwnerID && st.Holder.Token == next.Token {
			next.Since = st.Holder.Since
		}
		st.Holder = next
		who := "owner " + next.OwnerID
		if next.PodName != "" {
			who = "pod " + next.PodName
		}
		setCondition(lock, locksv1.ConditionHeld, metav1.ConditionTrue, "Held", "Held by "+who)
	}
	st.Waiting = nil
	for i := range pods {
		if pods[i].UID != holderUID && eligible(&pods[i]) {
			st.Waiting = append(st.Waiting, pods[i].Name)
		}
	}
	st.WaitingCount = int32(len(st.Waiting))
	r.Metrics.record(lock, len(holders) > 0, len(st.Waiting))
}

// eligible reports whether a pod may be granted the lock: it is alive, and
// either waits behind the gate or is running.
func eligible(pod *corev1.Pod) bool {
	if terminated(pod) {
		return false
	}
	return gated(pod) || pod.Status.Phase == corev1.PodRunning
}

func gated(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
		return g.Name == locksv1.SchedulingGate
	})
}

// terminated reports whether the pod is being deleted or has finished.
func terminated(pod *corev1.Pod) bool {
	return !pod.DeletionTimestamp.IsZero() || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

func terminationReason(pod *corev1.Pod) string {
	if !pod.DeletionTimestamp.IsZero() {
		return "is being deleted"
	}
	return "reached phase " + string(pod.Status.Phase)
}

// terminationTime is when the pod's end began, as far as the API shows: the
// deletion request, or the last container's or condition's change.
func terminationTime(pod *corev1.Pod) time.Time {
	if !pod.DeletionTimestamp.IsZero() {
		t := pod.DeletionTimestamp.Time
		if pod.DeletionGracePeriodSeconds != nil {
			t = t.Add(-time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second)
		}
		return t
	}
	var latest time.Time
	for _, cs := range pod.Status.ContainerStatuses {
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
