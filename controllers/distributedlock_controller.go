// Package controllers holds the DistributedLock controller.
//
// One reconcile settles one Redis key for every lock naming it. It reads
// (scope.go: the locks naming the key, live, refused or being deleted,
// their candidate pods, the holders Redis shows, this process's memory of
// its grant), and package decide resolves from that read who holds the key:
// the grantee and where that comes from (a lock's status.grant, Redis, or
// memory), whether its hold is kept, taken again or in conflict, whom it
// blocks and which gates it lifts. Nothing else decides who holds a key.
// The phases then decide, in order, what follows from that answer, and
// return it as writes (release.go: release stopped holders and forget ended
// grants; sticky.go: keep the grant; grant.go: grant the next candidate;
// record.go: check past the cache and record the grant; marks.go: the pods'
// marks and gates, a gate lifted only once its lock records the lift;
// deletion.go: let deleted locks go; startup.go: watch the holder start).
// One writer (writer.go) makes each phase's writes, with each write's
// failure policy, before the next phase decides. The statuses are computed
// on every exit (status.go, explain.go, failure.go: a failed write is a
// reason on the status and a Warning Event, never a status left
// unwritten) and written last, each preconditioned on the lock's
// resourceVersion, with the Events that announce them (announce.go). Pods
// whose gate no lock can lift are told so by the gate checker (gates.go).
package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// DistributedLockReconciler grants each Redis key named by DistributedLocks
// to one candidate pod at a time and holds it in Redis on the pod's behalf.
type DistributedLockReconciler struct {
	client.Client
	// APIReader reads past the cache. Before the controller ungates a pod,
	// it confirms there that no other pod still holds a grant of the key,
	// so a stale cache cannot let two guarded pods run.
	APIReader client.Reader
	Recorder  record.EventRecorder
	Locks     *LockClients
	Metrics   *Metrics
	// Keys says which keys outside its own a namespace may use.
	Keys KeyPolicy
	// MaxConcurrentReconciles is how many keys are settled at once;
	// 0 means DefaultMaxConcurrentReconciles.
	MaxConcurrentReconciles int

	// lost carries the keys whose lease the controller lost, or whose
	// release Redis published, so they are reconciled at once.
	lost chan event.TypedGenericEvent[string]
	// stopped closes when the manager stops, so nothing blocks on lost.
	stopped <-chan struct{}
	// keyReleases listens for single keys' releases on a Cluster with
	// sharded pub/sub, where watchReleases hears none; nil elsewhere.
	keyReleases *shardedReleases

	grants   grants
	keys     keyMutex
	podNames podNames
	backoff  redisBackoff
	// told are the pods told where they stand (explain.go).
	told toldPods
	// unwatchedWarned are, by key, the running pods outside the pod cache
	// that a HolderNotWatched Event was sent for (pollUnwatched).
	unwatchedWarned sync.Map // string -> map[types.UID]bool
	// unguardedWarned are, by key, the pods told that they name a lock of
	// the key but carry no gate of it (tellUnguarded).
	unguardedWarned sync.Map // string -> map[types.UID]bool
}

// +kubebuilder:rbac:groups=locks.lockwarden.dev,resources=distributedlocks,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=locks.lockwarden.dev,resources=distributedlocks/status,verbs=get;patch
// +kubebuilder:rbac:groups=locks.lockwarden.dev,resources=distributedlocks/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// KeyRequest asks for one Redis key to be settled. The key is the unit of
// work: every lock naming it agrees on one holder and one waiting order, so
// one reconcile settles them all, and the work queue never runs two
// reconciles of one key at once.
type KeyRequest struct{ Key string }

// Reconcile settles the key: it loads the scope, runs the phases, and
// writes the status of every lock naming the key.
func (r *DistributedLockReconciler) Reconcile(ctx context.Context, req KeyRequest) (ctrl.Result, error) {
	// The work queue runs one reconcile of a key at a time; this keeps a
	// caller outside it (a test) from running beside it.
	defer r.keys.lock(req.Key)()
	s, err := r.loadScope(ctx, req.Key)
	switch {
	case s == nil:
		return ctrl.Result{}, err // the locks could not be listed: no status can show it
	case err != nil:
		result, err := r.readFailed(ctx, s, err)
		return result, kerrors.NewAggregate([]error{err, r.patchStatuses(ctx, s)})
	case s.unnamed() && r.grants.get(req.Key) == nil:
		// No lock names the key and this process holds nothing of it: it is
		// none of the controller's business, and never polled.
		r.keyReleases.unwatch(req.Key)
		return ctrl.Result{}, nil
	}
	if err := r.addFinalizers(ctx, s); err != nil {
		// Nothing is granted to a lock whose deletion would not release it;
		// the statuses show the key as read, and why.
		if s.failed = failureOf("add the finalizer", err); s.failed == nil {
			return ctrl.Result{}, err // the lock changed since it was read: retried at once
		}
		return r.describe(ctx, s), kerrors.NewAggregate([]error{err, r.patchStatuses(ctx, s)})
	}
	for _, l := range s.ungiven {
		if err := r.letGo(ctx, s, l); err != nil {
			log.FromContext(ctx).Error(err, "cannot let a refused lock go", "lock", client.ObjectKeyFromObject(l))
		}
	}
	result, err := r.runPhases(ctx, s)
	return result, kerrors.NewAggregate([]error{err, r.patchStatuses(ctx, s)})
}

// describe computes the statuses from what the scope read, with no phase
// run: as Redis failing if it did.
func (r *DistributedLockReconciler) describe(ctx context.Context, s *scope) ctrl.Result {
	if s.redisErr != nil {
		result, _ := r.redisFailed(ctx, s, s.redisErr) // a Redis error: it shows, and returns none
		return result
	}
	if res := s.Resolve(); res.Grantee != nil && res.Conflict {
		s.markConflict(res.Grantee)
	}
	r.computeStatuses(ctx, s)
	return ctrl.Result{}
}

// runPhases runs the phases in order, and computes the statuses on every
// exit: a Redis failure stops them and shows as RedisUnavailable; a key
// holding data that is not a lock runs only the finalizers and shows as
// KeyInUse; a phase that fails stops the rest, and its failure shows as a
// reason of the Ready condition (failure), with a Warning Event once.
func (r *DistributedLockReconciler) runPhases(ctx context.Context, s *scope) (ctrl.Result, error) {
	if s.redisErr != nil {
		return r.redisFailed(ctx, s, s.redisErr)
	}
	if s.notALock {
		r.backoff.succeeded(s.Key)
		// Only a new key can fix it; deleting the lock lets it go, with no
		// grant of the key to release.
		actions, err := r.finalizeDeleted(ctx, s)
		if err == nil {
			err = r.apply(ctx, s, actions, true)
		}
		r.computeStatuses(ctx, s)
		return ctrl.Result{}, err
	}
	for _, phase := range []struct {
		name   string
		decide func(context.Context, *scope) ([]action, error)
		// independent: each write goes on its own (writer.go's apply).
		independent bool
	}{
		{"release stopped holders", r.releaseStopped, false},
		{"forget ended grants", r.forgetEndedGrants, false},
		{"keep grants", r.keepGrants, false},
		{"grant", r.grantNext, false},
		{"record the grant", r.recordGrant, false},
		{"mark pods", r.markPods, false},
		{"finalize deleted locks", r.finalizeDeleted, true},
		{"watch startup", r.watchStartup, false},
	} {
		actions, err := phase.decide(ctx, s)
		if err == nil {
			err = r.apply(ctx, s, actions, phase.independent)
		}
		if err != nil {
			if isRedisError(err) {
				return r.redisFailed(ctx, s, err)
			}
			s.failed = failureOf(phase.name, err)
			r.computeStatuses(ctx, s)
			return ctrl.Result{}, fmt.Errorf("%s: %w", phase.name, err)
		}
	}
	r.backoff.succeeded(s.Key)
	r.computeStatuses(ctx, s)
	// A grant the controller keeps needs no polling: its loss arrives on
	// the lost channel, and its pod's end as a pod event. Anyone else's
	// hold (even one under a controller owner ID that is no grant it
	// keeps) ends by a release, which Redis publishes (watchReleases), or
	// by its lease running out, which it does not.
	if h := s.Holders; len(h) > 0 && (s.conflict || s.grantee == nil || h[0].PodUID != s.grantee.UID) {
		s.requeue(pollAfter(s.info.TTL))
		r.keyReleases.watch(ctx, s.Key)
	} else {
		r.keyReleases.unwatch(s.Key)
	}
	// Nobody publishes a take: a free key that candidates take themselves
	// (mode Observe) is looked at again soon, to show a new holder, while a
	// candidate runs that could take it (one that starts is a pod event).
	if len(s.Holders) == 0 && slices.ContainsFunc(s.pods, s.observedRunning) {
		s.requeue(observePoll)
	}
	// Nor does an unwatched pod's end arrive as an event.
	r.pollUnwatched(ctx, s)
	return ctrl.Result{RequeueAfter: s.after}, nil
}

// observePoll is how soon a free key of a lock in mode Observe is looked at
// again: an in-pod client's new hold shows within a second.
const observePoll = 500 * time.Millisecond

// isRedisError reports whether Redis failed the call, or refused the lock
// client (a Redis user without a command the lock scripts run): shown on
// the locks as Redis failing, and retried.
func isRedisError(err error) bool {
	return errors.Is(err, redislock.ErrUnavailable) || errors.Is(err, redislock.ErrClosed) ||
		errors.Is(err, redislock.ErrPermission)
}

// redisFailed logs the Redis error and shows a redacted one: a condition
// never echoes what Redis said, which could tell a tenant about keys that
// are not theirs. Who holds the key is then unknown: the hold may have
// lapsed meanwhile.
func (r *DistributedLockReconciler) redisFailed(ctx context.Context, s *scope, err error) (ctrl.Result, error) {
	if !isRedisError(err) {
		return ctrl.Result{}, err
	}
	log.FromContext(ctx).Error(err, "Redis failed", "key", s.Key)
	r.unread(s, unreadKey{
		reason:   "RedisUnavailable",
		event:    "Redis did not answer, or refused the lock's commands: nothing is granted or released until it does; the manager's log has the error",
		ready:    "Redis did not answer, or refused the lock's commands; the manager's log has the error",
		held:     "Redis cannot be read, so who holds the lock is unknown",
		deleting: "Redis did not answer, so the lock being deleted cannot be released; it is retried. If Redis is gone for good, remove the finalizer by hand (see docs/operating.md)",
	})
	return ctrl.Result{RequeueAfter: r.backoff.failed(s.Key)}, nil
}

// readFailed shows that the key could not be read past its locks (its
// pods, or who holds it): as Redis failing if it did; else not Ready with
// the reason ReadFailed, retried by the work queue. A conflict shows
// nothing: it is retried at once.
func (r *DistributedLockReconciler) readFailed(ctx context.Context, s *scope, err error) (ctrl.Result, error) {
	if isRedisError(err) {
		return r.redisFailed(ctx, s, err)
	}
	if apierrors.IsConflict(err) {
		return ctrl.Result{}, err
	}
	r.unread(s, unreadKey{
		reason:   "ReadFailed",
		event:    "The manager could not read the key's pods or holders: nothing is granted or released until it can; the manager's log has the error",
		ready:    "the manager could not read the key's pods or holders; it is retried, and the manager's log has the error",
		held:     "the key's holders could not be read, so who holds the lock is unknown",
		deleting: "the manager could not read the key's pods or holders, so the lock being deleted cannot be released yet; it is retried",
	})
	return ctrl.Result{}, err
}

// unreadKey is how the locks show a key that could not be read: the Ready
// condition's reason, and the messages of the Warning Event, the Ready
// condition, the Held condition and a deleting lock's Ready condition.
type unreadKey struct{ reason, event, ready, held, deleting string }

// unread shows the key as unread: who holds it is unknown (the hold may
// have lapsed meanwhile), and the rest of each status is left as it was.
// One Warning Event is announced as each lock turns so, not one per retry.
func (r *DistributedLockReconciler) unread(s *scope, u unreadKey) {
	// What the phases announced is not what these statuses show.
	s.announcements = nil
	for _, l := range append(slices.Clip(s.Locks), s.Deleting...) {
		if c := meta.FindStatusCondition(l.Status.Conditions, locksv1.ConditionReady); c == nil || c.Reason != u.reason {
			s.announce(announcement{about: []*locksv1.DistributedLock{l}, object: l, eventType: corev1.EventTypeWarning, reason: u.reason, message: u.event})
		}
	}
	for _, l := range s.Locks {
		setCondition(l, locksv1.ConditionReady, metav1.ConditionFalse, u.reason, u.ready)
		if meta.FindStatusCondition(l.Status.Conditions, locksv1.ConditionHeld) != nil {
			setCondition(l, locksv1.ConditionHeld, metav1.ConditionUnknown, u.reason, u.held)
		}
	}
	for _, d := range s.Deleting {
		setCondition(d, locksv1.ConditionReady, metav1.ConditionFalse, u.reason, u.deleting)
	}
	// A refused lock learns nothing of the key, Redis's state included.
	for _, l := range s.Revoked {
		r.revokedStatus(s, l)
	}
	s.described = true
}

func setCondition(lock *locksv1.DistributedLock, condition string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&lock.Status.Conditions, metav1.Condition{
		Type: condition, Status: status, Reason: reason, Message: message, ObservedGeneration: lock.Generation,
	})
}

// effectiveKey is spec.key, or "<namespace>/<name>". It never comes from
// the status, which a lock naming another key could not be trusted with.
func effectiveKey(lock *locksv1.DistributedLock) string {
	if lock.Spec.Key != "" {
		return lock.Spec.Key
	}
	return lock.Namespace + "/" + lock.Name
}

// defaultTerms are the API's default lease terms, for a key's reads.
var defaultTerms = leaseTerms{lease: 30 * time.Second, renew: 10 * time.Second}

// termsOf is the lock's lease and renewal interval, as the controller holds
// it. The renewal interval is bounded below by maxRenewRate: the API allows
// 100ms, and thousands of locks renewed that often would be all of Redis's
// load, for no gain in safety once a lease has room for two more renewals.
func termsOf(lock *locksv1.DistributedLock) leaseTerms {
	t := leaseTerms{lease: 30 * time.Second} // the API's default
	if lock.Spec.LeaseDuration != nil {
		t.lease = lock.Spec.LeaseDuration.Duration
	}
	t.renew = t.lease / 3
	if lock.Spec.RenewInterval != nil {
		t.renew = lock.Spec.RenewInterval.Duration
	}
	t.renew = max(t.renew, min(maxRenewRate, t.lease/3))
	return t
}

// maxRenewRate is the shortest renewal interval the controller uses, unless
// the lease is under three times as long: then a third of the lease.
const maxRenewRate = time.Second

// ownerFor is the owner ID under which the controller holds a lock for a pod.
func ownerFor(podUID types.UID) redislock.Owner {
	return redislock.Owner(fmt.Sprintf("%s:%d", podUID, controllerOwnerN))
}

// controllerOwnerN ends the owner IDs of the controller's holds, "<uid>:0".
// In-pod clients number their owners from 1.
const controllerOwnerN = 0

// eventf records an Event on each lock of the scope in the namespace, so a
// namespace only ever reads about its own pods.
func (r *DistributedLockReconciler) eventf(s *scope, namespace, eventType, reason, format string, args ...any) {
	for _, l := range s.Locks {
		if l.Namespace == namespace {
			r.Recorder.Eventf(l, eventType, reason, format, args...)
		}
	}
}
