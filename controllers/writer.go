package controllers

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// The writer. The phases decide; this file acts. Each phase returns the
// writes it decided on (take, give back, release, record, lift, mark,
// evict, let go), and apply makes them, in order, each with its own
// failure policy, and keeps the scope in step with what it wrote, so the
// next phase decides on what is now true. A write that fails either fails
// the phase, and shows as a reason on the locks' status (failure.go), or is
// logged and retried, as its policy says; the statuses are written on every
// exit, after the phases (patchStatuses), with the Events they announce.
// Besides the phases' writes, the reconcile writes the finalizers
// (addFinalizers) and, last, the statuses (patchStatuses), here too.

// action is one write a phase decided on. apply makes it, and returns an
// error only if the phase must stop and show it.
type action interface {
	apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error
}

// errHoldGivenBack stops a phase without failing it: the hold its later
// writes were decided with was given back (tokenBehind), so they are
// dropped, and the next phases decide on the key as it now is.
var errHoldGivenBack = errors.New("the hold was given back")

// apply makes the phase's writes in order. The first failure stops the
// rest, unless the phase's writes are independent (each lock being deleted
// goes on its own): then every write is tried, and the failures are joined.
func (r *DistributedLockReconciler) apply(ctx context.Context, s *scope, actions []action, independent bool) error {
	var errs []error
	for _, a := range actions {
		err := a.apply(ctx, r, s)
		switch {
		case errors.Is(err, errHoldGivenBack) && independent:
			// Only this write's own sequence depended on the hold.
		case errors.Is(err, errHoldGivenBack):
			return nil
		case err != nil && !independent:
			return err
		case err != nil:
			errs = append(errs, err)
		}
	}
	return kerrors.NewAggregate(errs)
}

// inOrder is writes applied in order until one fails: one deleting lock's
// release of its grants, then its letting go.
type inOrder []action

func (o inOrder) apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error {
	for _, a := range o {
		if err := a.apply(ctx, r, s); err != nil {
			return err
		}
	}
	return nil
}

// release force-releases a holder's ownership of the key: its pod has
// stopped or is gone, or (deleting set) the lock being deleted ends its
// grant.
type release struct {
	holder          holder
	name, namespace string
	why             string
	deleting        *locksv1.DistributedLock
}

func (a release) apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error {
	h := a.holder
	if !slices.ContainsFunc(s.Holders, func(o holder) bool { return o.Owner == h.Owner }) {
		return nil // released by an earlier write of this reconcile, or given back
	}
	if _, err := s.client.ForceReleaseClient(ctx, s.Key, string(h.PodUID)); err != nil {
		return err
	}
	r.grants.drop(s.Key, h.PodUID)
	s.Holders = slices.DeleteFunc(s.Holders, func(o holder) bool { return o.Owner == h.Owner })
	if d := a.deleting; d != nil {
		r.Recorder.Eventf(d, corev1.EventTypeNormal, "Released", "Released %s from pod %s: the DistributedLock is being deleted", s.Key, a.name)
		r.Metrics.transition(d, "released")
		return nil
	}
	if h.Pod != nil {
		r.Metrics.observeRelease(time.Since(decide.StopTime(h.Pod)))
	}
	log.FromContext(ctx).Info("released the lock of a stopped pod", "key", s.Key, "pod", a.name, "owner", h.Owner)
	r.eventf(s, a.namespace, corev1.EventTypeNormal, "HolderTerminated", "Released %s: holder pod %s %s", s.Key, a.name, a.why)
	for _, l := range s.LocksIn(a.namespace) {
		r.Metrics.transition(l, "holder_terminated")
	}
	return nil
}

// forgetGrant forgets this process's grant of the key to the pod.
type forgetGrant struct{ pod types.UID }

func (a forgetGrant) apply(_ context.Context, r *DistributedLockReconciler, s *scope) error {
	r.grants.drop(s.Key, a.pod)
	return nil
}

// lostGrant forgets a grant whose hold this process lost, keeps it without
// a hold if its pod keeps the grant (keep), and tells the loss unless the
// hold ended by the controller's own release.
type lostGrant struct {
	grant *grant
	pod   *corev1.Pod
	keep  bool
}

func (a lostGrant) apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error {
	g := a.grant
	r.grants.drop(s.Key, g.PodUID)
	if a.pod == nil || released(g.hold) {
		return nil
	}
	if a.keep {
		r.grants.put(s.Key, &grant{PodUID: g.PodUID, Pod: g.Pod})
	}
	cause := redislock.ErrNotOwner
	if err := g.hold.Err(); err != nil {
		cause = err
	}
	log.FromContext(ctx).Info("lost a lock held for a pod", "key", s.Key, "pod", a.pod.Name, "cause", cause.Error())
	r.eventf(s, a.pod.Namespace, corev1.EventTypeWarning, "Lost", "Lost %s held for pod %s: %s", s.Key, a.pod.Name, redactLoss(cause))
	for _, l := range s.LocksIn(a.pod.Namespace) {
		r.Metrics.transition(l, "lost")
	}
	return nil
}

// take takes the free key for the pod, under the lease terms of its policy
// lock: a new grant, or (again) the grantee's grant taken again after
// Redis lost it. Somebody taking the key meanwhile ends a new grant's
// attempt; for a grantee, it is a conflict.
type take struct {
	pod   *corev1.Pod
	again bool
}

func (a take) apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error {
	pod := a.pod
	terms, c, err := r.clientFor(s, pod)
	if err != nil {
		return err
	}
	hold, err := acquire(ctx, c, s.Key, ownerFor(pod.UID))
	switch {
	case errors.Is(err, redislock.ErrWaitTimeout) && !a.again:
		return s.reread(ctx) // taken meanwhile
	case errors.Is(err, redislock.ErrWaitTimeout):
		if err := s.reread(ctx); err != nil {
			return err
		}
		if h, ok := s.HeldBy(pod.UID); !ok || !h.ByController() {
			s.markConflict(pod)
		}
		return nil
	case err != nil:
		return err
	}
	r.remember(s, pod, terms, hold)
	s.Holders = []holder{{Owner: string(ownerFor(pod.UID)), PodUID: pod.UID, Pod: pod}}
	s.info.Token, s.taken = hold.Token(), hold
	if a.again {
		r.eventf(s, pod.Namespace, corev1.EventTypeNormal, "Reacquired",
			"Took %s again for pod %s, which was granted it and has not stopped, with fencing token %d", s.Key, pod.Name, hold.Token())
		return nil
	}
	s.grantee, s.newGrant = pod, true
	return nil
}

// adopt takes over the renewal of the grantee's hold that Redis shows and
// this process does not renew (made before the manager restarted, or by
// another replica), keeping its fencing token: it re-enters the ownership.
// A hold under other lease terms (the lock's leaseDuration changed since)
// cannot be re-entered under the lock's, as the library refuses it so as
// not to cut another holder's lease; nobody else renews the controller's
// grants, so the ownership the scope saw is released and the key taken
// again for the pod, with a new token. The level adopt adds is given back
// (giveBack) if the check past the cache finds another grant out.
type adopt struct{ pod *corev1.Pod }

func (a adopt) apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error {
	pod := a.pod
	terms, c, err := r.clientFor(s, pod)
	if err != nil {
		return err
	}
	hold, err := acquire(ctx, c, s.Key, ownerFor(pod.UID))
	retaken := false
	if errors.Is(err, redislock.ErrLeaseMismatch) {
		// Only the ownership the scope saw: one taken since is re-entered.
		n, releaseErr := s.client.ForceReleaseOwnership(ctx, s.Key, string(pod.UID), s.info.Token)
		if releaseErr != nil {
			return releaseErr
		}
		hold, err = acquire(ctx, c, s.Key, ownerFor(pod.UID))
		retaken = n > 0
	}
	if errors.Is(err, redislock.ErrWaitTimeout) {
		// Lost meanwhile, and somebody else holds the key: what the scope
		// read of Redis is over, and nothing may be lifted with it.
		return s.reread(ctx)
	}
	if err != nil {
		return err
	}
	r.remember(s, pod, terms, hold)
	// The token is the ownership's, which may be newer than the one the
	// scope read.
	s.info.Token = hold.Token()
	if retaken {
		s.taken = hold
		r.eventf(s, pod.Namespace, corev1.EventTypeNormal, "Reacquired",
			"Took %s again for pod %s under the lock's new lease terms, with fencing token %d", s.Key, pod.Name, hold.Token())
		return nil
	}
	s.adopted = hold
	log.FromContext(ctx).Info("adopted a lock held in Redis", "key", s.Key, "pod", pod.Name, "token", hold.Token())
	return nil
}

// confirm checks past the cache, before a gate is lifted with the pod's
// hold, that no other grant of the key is out and no higher fencing token
// is recorded (confirmNoOtherGrant). A higher token gives the hold back to
// be taken again later (tokenBehind); another grant, or a failed read,
// gives back this reconcile's take or its level of an adopted hold (only
// one of them is set) and fails the phase.
type confirm struct{ pod *corev1.Pod }

func (a confirm) apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error {
	switch behind, err := r.confirmNoOtherGrant(ctx, s, a.pod); {
	case behind:
		return r.tokenBehind(ctx, s, a.pod)
	case err != nil:
		return r.giveBack(ctx, s, a.pod, cmp.Or(s.taken, s.adopted), err)
	}
	return nil
}

// writeRecord writes status fields of a lock (highestToken, and the grant on
// the locks of its pod's namespace), preconditioned on the lock's
// resourceVersion. Its failure policy tells a new grant from a re-take:
// only a take that a gate would be lifted with (lifting) is ever given
// back; a take no gate is lifted with keeps its hold while the record is
// retried.
type writeRecord struct {
	lock    *locksv1.DistributedLock
	fields  map[string]any
	pod     *corev1.Pod
	lifting bool
}

func (a writeRecord) apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error {
	l, pod := a.lock, a.pod
	err := r.patchStatusFields(ctx, s, l, a.fields)
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err) && a.lifting:
		// Deleted since the scope was read: the view is stale, and a gate
		// of a lock that is gone is not lifted.
		return r.giveBack(ctx, s, pod, s.taken, fmt.Errorf("lock %s/%s is gone: %w", l.Namespace, l.Name, err))
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsInvalid(err) && a.lifting:
		return r.tokenBehind(ctx, s, pod)
	case a.lifting:
		// A pod whose gate was lifted already, as the API server shows,
		// holds a recorded grant (no gate is lifted before its record): the
		// take is kept for it, as a re-take's is. Decided on a view in
		// which it was still gated, the take is otherwise given back.
		if ungated, readErr := r.ungatedPastCache(ctx, s, pod); readErr != nil || !ungated {
			return r.giveBack(ctx, s, pod, s.taken, errors.Join(err, readErr))
		}
		return err
	}
	// A take no gate is lifted with (a re-take for a grantee that may run,
	// a grant to a pod without a gate) keeps its hold, and the record is
	// tried again: giving it back would publish a release under a pod that
	// may run, and wake every waiter outside the controller.
	return err
}

// granted tells that the grant to the pod is recorded (tellGranted).
type granted struct {
	pod   *corev1.Pod
	token int64
}

func (a granted) apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error {
	log.FromContext(ctx).Info("granted the lock", "key", s.Key, "pod", a.pod.Name, "uid", a.pod.UID, "token", a.token)
	r.tellGranted(s, a.pod, a.token)
	return nil
}

// mark brings a pod to the marks and gates it should carry (want). Only
// the holder's failure fails the key: another pod's marks are for display,
// and a pod its tenant made hard to patch must not hold the key back for
// everyone.
type mark struct {
	pod, want *corev1.Pod
	holder    bool
}

func (a mark) apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error {
	pod := a.pod
	if err := r.patchPod(ctx, pod, a.want); err != nil {
		if a.holder {
			return &updateRefused{object: pod, err: err}
		}
		log.FromContext(ctx).Error(err, "cannot update a pod's marks", "key", s.Key, "pod", client.ObjectKeyFromObject(pod))
		return nil
	}
	if len(a.want.Spec.SchedulingGates) < len(pod.Spec.SchedulingGates) {
		log.FromContext(ctx).Info("lifted the lock's gate", "key", s.Key, "pod", pod.Name, "uid", pod.UID, "token", s.info.Token)
	}
	return nil
}

// finishLift lifts a deleting lock's gate from the pod its status records
// lifting it from, under the grant the controller holds for the pod, after
// the check past the cache. Its failure (a conflict with this reconcile's
// own patch of the pod, a view found stale) is logged, and tried again
// within a second.
type finishLift struct {
	lock *locksv1.DistributedLock
	pod  *corev1.Pod
}

func (a finishLift) apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error {
	d, pod := a.lock, a.pod
	if !s.heldByController(pod) {
		return nil // given back by an earlier write of this reconcile (tokenBehind)
	}
	err := func() error {
		switch behind, err := r.confirmNoOtherGrant(ctx, s, pod); {
		case behind:
			// The pod has not started: its hold is given back and taken
			// again (keepGrants, as the record keeps the grant its own)
			// until the clock has passed the record.
			if err := r.tokenBehind(ctx, s, pod); !errors.Is(err, errHoldGivenBack) {
				return err
			}
			return nil
		case err != nil:
			return err
		}
		h, _ := s.HeldBy(pod.UID)
		want := pod.DeepCopy()
		setMarks(want, d.Name, h.Owner, s.info.Token)
		liftGate(want, d.Name)
		if err := r.patchPod(ctx, pod, want); err != nil {
			return err
		}
		log.FromContext(ctx).Info("finished the gate lift a deleting lock recorded", "key", s.Key, "lock", d.Name, "pod", pod.Name, "token", s.info.Token)
		return nil
	}()
	if err != nil {
		log.FromContext(ctx).Error(err, "cannot finish a deleting lock's recorded lift", "lock", client.ObjectKeyFromObject(d), "pod", pod.Name)
		s.requeue(time.Second)
	}
	return nil
}

// clearRecord forgets a lock's record of a grant to the pod that its
// deleting namespace-mate ended (written with the status), unless Redis
// still holds the key for the pod once the releases before it are made.
type clearRecord struct {
	lock *locksv1.DistributedLock
	pod  types.UID
}

func (a clearRecord) apply(_ context.Context, _ *DistributedLockReconciler, s *scope) error {
	if _, held := s.HeldBy(a.pod); !held {
		a.lock.Status.Grant = nil
	}
	return nil
}

// letGo removes the finalizer of a lock being deleted: it has nothing left
// to release.
type letGo struct{ lock *locksv1.DistributedLock }

func (a letGo) apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error {
	return r.letGo(ctx, s, a.lock)
}

// letGo removes the lock's finalizer.
func (r *DistributedLockReconciler) letGo(ctx context.Context, s *scope, d *locksv1.DistributedLock) error {
	patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(d, locksv1.Finalizer)
	if err := r.Patch(ctx, d, patch); client.IgnoreNotFound(err) != nil {
		return err
	}
	delete(s.before, client.ObjectKeyFromObject(d)) // gone: no status to write
	r.Metrics.forget(client.ObjectKeyFromObject(d))
	return nil
}

// evict evicts a holder that has not started within its policy lock's
// startTimeout: only the pod seen, as seen (a pod that started since, or a
// new pod of the same name, is not evicted). A PodDisruptionBudget's
// refusal, or throttling, is no failure to back off from: it is tried
// again, as kubectl drain does.
type evict struct {
	lock    *locksv1.DistributedLock
	pod     *corev1.Pod
	timeout time.Duration
}

func (a evict) apply(ctx context.Context, r *DistributedLockReconciler, s *scope) error {
	l, pod := a.lock, a.pod
	eviction := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID, ResourceVersion: &pod.ResourceVersion}}}
	err := client.IgnoreNotFound(r.SubResource("eviction").Create(ctx, pod, eviction))
	switch {
	case apierrors.IsConflict(err):
		s.requeue(time.Second) // it changed: look again
		return nil
	case apierrors.IsTooManyRequests(err):
		r.Recorder.Eventf(l, corev1.EventTypeWarning, "EvictionRefused",
			"Could not evict %s, which has not started within %v: the API server refused it for now (a PodDisruptionBudget, or throttling); trying again every %v", pod.Name, a.timeout, evictionRetry)
		s.requeue(evictionRetry)
		return nil
	case err != nil:
		return err
	}
	r.Recorder.Eventf(l, corev1.EventTypeWarning, "Evicted", "Evicted %s, which had not started within %v; the lock is released once it is gone", pod.Name, a.timeout)
	return nil
}

// tokenBehind gives back the pod's hold of the key, whose token is below
// one recorded for the key: Redis hands out tokens below one it handed out
// before (a restart that lost the counter, while this manager's clock is
// behind the clock of the client that took the last grant). Tokens follow
// the clock: the key is tried again every second, and taken once this clock
// has passed the recorded token. The whole ownership goes, whoever took it
// (this reconcile, or another manager, before a restart or beside this
// one): the admission policy refuses a lift with its token, so no gate was
// lifted with it, and none could be. Only that ownership, judged by its
// token: another manager may have taken the key again for the pod since,
// with a token above the record, and lifted the gate with it. It returns
// errHoldGivenBack once the hold is given back.
func (r *DistributedLockReconciler) tokenBehind(ctx context.Context, s *scope, pod *corev1.Pod) error {
	s.notReady = &condition{"FencingTokenBehind", fmt.Sprintf(
		"a fencing token above %d, the one Redis gave the latest grant, is recorded for the key: the grant was given back, and is tried again every second", s.info.Token)}
	s.requeue(time.Second)
	if _, err := s.client.ForceReleaseOwnership(ctx, s.Key, string(pod.UID), s.info.Token); err != nil {
		return err
	}
	r.grants.drop(s.Key, pod.UID)
	s.Holders, s.grantee, s.taken, s.adopted = nil, nil, nil, nil
	return errHoldGivenBack
}

// giveBack undoes the level of the pod's hold that this reconcile took,
// hold, which must not be used, if it is not nil; it returns why (nil if it
// is no failure). It undoes that level only: the owner ID is the pod's, so
// another manager that took the key for the same pod meanwhile re-entered
// the same ownership, and may have recorded its grant and lifted the gate
// with it.
func (r *DistributedLockReconciler) giveBack(ctx context.Context, s *scope, pod *corev1.Pod, hold *handle, why error) error {
	if hold == nil {
		return why
	}
	if err := giveUp(ctx, hold); err != nil {
		return errors.Join(why, fmt.Errorf("giving the hold back failed: %w", err))
	}
	r.grants.drop(s.Key, pod.UID)
	s.Holders, s.grantee, s.taken, s.adopted = nil, nil, nil, nil
	return why
}

// remember records a grant and arranges for its loss to wake the locks
// naming its key.
func (r *DistributedLockReconciler) remember(s *scope, pod *corev1.Pod, terms leaseTerms, hold *handle) {
	r.grants.put(s.Key, &grant{PodUID: pod.UID, Pod: client.ObjectKeyFromObject(pod), hold: hold})
	r.Locks.track(terms, hold)
	key := s.Key
	context.AfterFunc(hold.Context(), func() {
		if !released(hold) {
			r.wake(key)
		}
	})
}

// patchStatusFields writes the status fields to the lock, preconditioned on
// its resourceVersion, and keeps the scope's copies in step with the result.
func (r *DistributedLockReconciler) patchStatusFields(ctx context.Context, s *scope, l *locksv1.DistributedLock, status map[string]any) error {
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": l.ResourceVersion}, "status": status})
	if err != nil {
		return err
	}
	written := l.DeepCopy()
	if err := r.Status().Patch(ctx, written, client.RawPatch(types.MergePatchType, data)); err != nil {
		return err
	}
	l.ResourceVersion = written.ResourceVersion
	l.Status.HighestToken, l.Status.Grant = written.Status.HighestToken, written.Status.Grant
	if before := s.before[client.ObjectKeyFromObject(l)]; before != nil {
		before.ResourceVersion = written.ResourceVersion
		before.Status.HighestToken, before.Status.Grant = written.Status.HighestToken, written.Status.Grant.DeepCopy()
	}
	return nil
}

// patchPod writes the difference between pod and want, if any, as a merge
// patch of the labels and annotations that changed, key by key, and of
// the whole gate list if it changed, preconditioned on the pod's
// resourceVersion: a concurrent change to the gates must fail the patch
// rather than be overwritten. The cache keeps only lockwarden's own
// annotations (stripPod), so the patch must never set the annotations as a
// whole: once the marks are cleared, that would delete every other tool's.
func (r *DistributedLockReconciler) patchPod(ctx context.Context, pod, want *corev1.Pod) error {
	metadata := map[string]any{"resourceVersion": pod.ResourceVersion}
	patch := map[string]any{"metadata": metadata}
	if changes := changedKeys(pod.Labels, want.Labels); len(changes) > 0 {
		metadata["labels"] = changes
	}
	if changes := changedKeys(pod.Annotations, want.Annotations); len(changes) > 0 {
		metadata["annotations"] = changes
	}
	if !slices.Equal(pod.Spec.SchedulingGates, want.Spec.SchedulingGates) {
		patch["spec"] = map[string]any{"schedulingGates": want.Spec.SchedulingGates}
	}
	if len(metadata) == 1 && patch["spec"] == nil {
		return nil
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	return client.IgnoreNotFound(r.Patch(ctx, want, client.RawPatch(types.MergePatchType, data)))
}

// addFinalizers gives each live lock of the key that may use it the
// finalizer before anything is granted or marked for it, so that its
// deletion releases whatever it was given. A lock of a namespace that may
// not use the key gets none: it is given nothing.
func (r *DistributedLockReconciler) addFinalizers(ctx context.Context, s *scope) error {
	for _, l := range s.Locks {
		if controllerutil.ContainsFinalizer(l, locksv1.Finalizer) {
			continue
		}
		patch := client.MergeFromWithOptions(l.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(l, locksv1.Finalizer)
		if err := r.Patch(ctx, l, patch); err != nil {
			controllerutil.RemoveFinalizer(l, locksv1.Finalizer)
			return &updateRefused{object: l, err: err}
		}
		s.before[client.ObjectKeyFromObject(l)] = l.DeepCopy()
	}
	return nil
}

// patchStatuses writes the status of every lock in the scope that changed.
// A refused lock's write failing fails nothing else: the lock is another
// namespace's, whose tenant must not be able to hold this key's reconciles
// back.
//
// Then it sends the announcements about the statuses it wrote.
func (r *DistributedLockReconciler) patchStatuses(ctx context.Context, s *scope) error {
	var errs []error
	written := map[*locksv1.DistributedLock]bool{}
	for _, l := range s.All() {
		before := s.before[client.ObjectKeyFromObject(l)]
		if before == nil {
			continue
		}
		err := r.patchStatus(ctx, before, l, s.described)
		written[l] = err == nil
		if err != nil && slices.Contains(s.Revoked, l) {
			log.FromContext(ctx).Error(err, "cannot write a refused lock's status", "lock", client.ObjectKeyFromObject(l))
			continue
		}
		errs = append(errs, err)
	}
	r.announceWritten(s, written)
	return kerrors.NewAggregate(errs)
}

// patchStatus writes the status if, and only if, it changed, so holding a
// lock steadily writes nothing to the API server. The write is
// preconditioned on the lock's resourceVersion: a manager that read the
// lock before another wrote it (a grant's record, say) must not write over
// it, however long it was paused. observedGeneration is stamped only when
// the reconcile computed the lock's status from this generation
// (described): a status written on an exit that computed none (a record
// written before a failure) does not claim to describe it.
func (r *DistributedLockReconciler) patchStatus(ctx context.Context, before, lock *locksv1.DistributedLock, described bool) error {
	if described {
		lock.Status.ObservedGeneration = lock.Generation
		for i := range lock.Status.Conditions {
			lock.Status.Conditions[i].ObservedGeneration = lock.Generation
		}
	}
	if equality.Semantic.DeepEqual(before.Status, lock.Status) {
		return nil
	}
	return client.IgnoreNotFound(r.Status().Patch(ctx, lock, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})))
}
