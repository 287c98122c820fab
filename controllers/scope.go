package controllers

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// scope is everything one reconcile of a key knows, loaded once.
type scope struct {
	key string
	// locks are the live locks naming the key whose namespaces may use it,
	// by namespace and name. Their statuses are computed in place.
	locks []*locksv1.DistributedLock
	// revoked are the live locks naming the key from namespaces that may
	// not use it (any more: the administrator un-shared it). They grant
	// nothing, learn nothing of the key's grants, and their pods' marks
	// are never set, but a grant one of them made while it could, as its
	// status records it, is kept until its pod stops (recordedGrantee).
	revoked []*locksv1.DistributedLock
	// deleting are the locks naming the key that are being deleted and
	// still carry the finalizer, whichever their namespace. They grant
	// nothing new; a grant whose gate one of them lifted is kept until its
	// pod stops, and only then does the lock go (finalizeDeleted).
	deleting []*locksv1.DistributedLock
	// ungiven are the deleting locks of namespaces that may not use the key
	// that record no grant: only their finalizer is removed.
	ungiven []*locksv1.DistributedLock
	before  map[types.NamespacedName]*locksv1.DistributedLock

	// client reads and releases the key. Holds are taken through the
	// Client of the lease terms of the lock that grants them (clientFor).
	client *redislock.Client

	// pods are the pods the key concerns: those its locks select, or whose
	// gates or marks of them they carry (podsOf), those of the locks'
	// namespaces behind an owner or waiter Redis shows, and the known
	// holders the cache lacks (addKnownHolders). Pods of other namespaces
	// are never shown, released or written. They are the cache's own
	// objects, never written to.
	pods       []*corev1.Pod
	byUID      map[types.UID]*corev1.Pod
	namespaces map[string]bool
	podByUID   func(context.Context, types.UID) (*corev1.Pod, error)
	// candidates are the pods some lock in mode Grant selects, oldest
	// first: the one waiting order every such lock naming the key shares.
	candidates []*corev1.Pod
	// unwatched are the pods of the scope that the cache lacks, read from
	// the API server because the controller knows them as holders.
	unwatched map[types.UID]bool
	// mayUse are the namespaces that may use the key.
	mayUse map[string]bool
	// gone are the known holders the API server says are gone: the only
	// holders missing from the scope that may be released.
	gone map[types.UID]types.NamespacedName

	// info is Redis's view of the key; holders are its owners.
	info    redislock.LockInfo
	holders []holder
	// redisErr is why Redis could not be read; notALock is set when the key
	// holds data that is not a lock.
	redisErr error
	notALock bool

	// grantee is the pod the controller granted the key to and that has not
	// stopped: the grant is sticky until it stops. conflict is set when
	// somebody else holds the key in Redis meanwhile.
	grantee  *corev1.Pod
	conflict bool
	// taken is the hold this reconcile took in Redis for the grantee:
	// recordGrant gives it back if it must not be used. adopted is the
	// level it added to a hold it adopted instead: given back only if the
	// check past the cache finds another grant out. newGrant is set when
	// the take is a new grant, not the same grant taken again.
	taken, adopted *handle
	newGrant       bool
	// notReady, if set, is why the key's locks are not Ready, though Redis
	// answered.
	notReady *condition
	// gateMemo is gateLocksOf's memory, and candidateAt each candidate's
	// place in the waiting order.
	gateMemo    map[types.UID]gateResult
	candidateAt map[types.UID]int
	// after is how soon the key must be looked at again, or 0.
	after time.Duration
}

// all are the scope's locks of every kind, for their statuses.
func (s *scope) all() []*locksv1.DistributedLock {
	return append(append(slices.Clip(s.locks), s.revoked...), s.deleting...)
}

// gateLocksOf is gateLocks of the pod, once a reconcile: a key's waiting
// order asks it of every gated pod, more than once.
func (s *scope) gateLocksOf(ctx context.Context, r *DistributedLockReconciler, pod *corev1.Pod) ([]*locksv1.DistributedLock, []gateProblem, error) {
	if g, ok := s.gateMemo[pod.UID]; ok {
		return g.locks, g.problems, nil
	}
	locks, problems, err := r.gateLocks(ctx, pod)
	if err != nil {
		return nil, nil, err
	}
	if s.gateMemo == nil {
		s.gateMemo = map[types.UID]gateResult{}
	}
	s.gateMemo[pod.UID] = gateResult{locks, problems}
	return locks, problems, nil
}

// gateResult is what gateLocks said of a pod.
type gateResult struct {
	locks    []*locksv1.DistributedLock
	problems []gateProblem
}

// condition is a condition's reason and message.
type condition struct{ reason, message string }

// requeue asks for another look at the key within d.
func (s *scope) requeue(d time.Duration) {
	if s.after == 0 || d < s.after {
		s.after = d
	}
}

// holder is an owner of the key in Redis. pod is set when the owner ID
// starts with the UID of a pod in the scope's namespaces.
type holder struct {
	owner  redislock.Owner
	podUID types.UID
	pod    *corev1.Pod
}

func (h holder) byController() bool { return strings.HasSuffix(string(h.owner), ":0") }

// ownerPattern is Redisson's "<id>:<n>". A field of any other shape means
// the key is some other hash, whose fields are none of the tenant's business.
var ownerPattern = regexp.MustCompile(`^[^:\s]+:[0-9]+$`)

// loadScope reads the locks naming the key, their pods and Redis.
func (r *DistributedLockReconciler) loadScope(ctx context.Context, key string) (*scope, error) {
	s := &scope{
		key: key, byUID: map[types.UID]*corev1.Pod{}, before: map[types.NamespacedName]*locksv1.DistributedLock{},
		namespaces: map[string]bool{}, mayUse: map[string]bool{}, unwatched: map[types.UID]bool{}, gone: map[types.UID]types.NamespacedName{},
		podByUID: r.podByUID,
	}
	var list locksv1.DistributedLockList
	if err := r.List(ctx, &list, client.MatchingFields{keyIndex: key}); err != nil {
		return nil, err
	}
	slices.SortFunc(list.Items, func(a, b locksv1.DistributedLock) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for i := range list.Items {
		l := &list.Items[i]
		switch {
		case !l.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(l, locksv1.Finalizer):
			continue // nothing of it is left to settle
		case !l.DeletionTimestamp.IsZero() && !r.Keys.Permits(l.Namespace, key) && l.Status.Grant == nil:
			// A lock of a namespace that may not use the key, which records
			// no grant, was given nothing (its finalizer, if any, is its
			// tenant's own): it takes no part in the key.
			s.ungiven = append(s.ungiven, l)
			continue
		case !l.DeletionTimestamp.IsZero():
			s.deleting = append(s.deleting, l)
		case !r.Keys.Permits(l.Namespace, key):
			s.revoked = append(s.revoked, l)
		default:
			s.locks = append(s.locks, l)
		}
		s.namespaces[l.Namespace] = true
		s.mayUse[l.Namespace] = r.Keys.Permits(l.Namespace, key)
		s.before[client.ObjectKeyFromObject(l)] = l.DeepCopy()
	}
	for _, l := range s.all() {
		pods, err := r.podsOf(ctx, l)
		if err != nil {
			return nil, err
		}
		for _, p := range pods {
			s.addPod(p)
		}
	}
	for _, p := range s.pods {
		if slices.ContainsFunc(s.selectors(p), grantsFor) {
			s.candidates = append(s.candidates, p)
		}
	}
	slices.SortFunc(s.candidates, func(a, b *corev1.Pod) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	s.candidateAt = make(map[types.UID]int, len(s.candidates))
	for i, p := range s.candidates {
		s.candidateAt[p.UID] = i
	}
	// After the candidates: a known holder found only now is none.
	if err := r.addKnownHolders(ctx, s); err != nil {
		return nil, err
	}
	c, err := r.Locks.For(defaultTerms)
	if isRedisError(err) {
		s.redisErr = err
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	s.client = c
	if err := s.readRedis(ctx); err != nil {
		return nil, err
	}
	r.holderToken(s)
	s.grantee = r.granteeOf(s)
	return s, nil
}

// readRedis inspects the key and maps its owners to pods.
func (s *scope) readRedis(ctx context.Context) error {
	info, err := s.client.Inspect(ctx, s.key)
	switch {
	case err != nil && strings.Contains(err.Error(), "WRONGTYPE"):
		s.notALock = true
		s.markNotALock()
		return nil
	case isRedisError(err):
		s.redisErr = err
		return nil
	case err != nil: // an invalid name, which admission refuses
		return err
	}
	s.info, s.holders = info, nil
	for _, h := range info.Holders {
		owner := string(h.Owner)
		if !ownerPattern.MatchString(owner) {
			s.notALock = true
			s.markNotALock()
			return nil
		}
		uid := types.UID(owner[:strings.LastIndexByte(owner, ':')])
		pod, err := s.ownerPod(ctx, uid)
		if err != nil {
			return err
		}
		s.holders = append(s.holders, holder{owner: h.Owner, podUID: uid, pod: pod})
	}
	for _, w := range info.Waiters {
		if i := strings.LastIndexByte(string(w), ':'); i > 0 {
			if _, err := s.ownerPod(ctx, types.UID(w[:i])); err != nil {
				return err
			}
		}
	}
	return nil
}

// holderToken fills in the holder's fencing token when Redis no longer
// shows it: the counter it came from is gone while the ownership lives on
// (Redis lost it in a restart without its data; a leader holds for weeks).
// The token is then the one this process took, or the one the locks
// recorded for that owner.
func (r *DistributedLockReconciler) holderToken(s *scope) {
	if len(s.holders) == 0 || s.info.Token != 0 {
		return
	}
	h := s.holders[0]
	if g := r.grants.get(s.key); g != nil && g.podUID == h.podUID && g.hold != nil && h.byController() {
		s.info.Token = g.hold.Token()
		return
	}
	for _, l := range s.all() {
		if st := l.Status.Holder; st != nil && st.OwnerID == string(h.owner) {
			s.info.Token = max(s.info.Token, st.Token)
		}
		if g := l.Status.Grant; g != nil && h.byController() && g.PodUID == string(h.podUID) {
			s.info.Token = max(s.info.Token, g.Token)
		}
	}
}

// addPod adds a pod to the scope, once.
func (s *scope) addPod(p *corev1.Pod) {
	if s.byUID[p.UID] == nil {
		s.pods = append(s.pods, p)
		s.byUID[p.UID] = p
	}
}

// ownerPod is the pod of the scope's namespaces with the UID an owner ID in
// Redis starts with, or nil: it is added to the scope if it was not in it.
func (s *scope) ownerPod(ctx context.Context, uid types.UID) (*corev1.Pod, error) {
	if p := s.byUID[uid]; p != nil {
		return p, nil
	}
	p, err := s.podByUID(ctx, uid)
	if err != nil || p == nil || !s.namespaces[p.Namespace] {
		return nil, err
	}
	s.addPod(p)
	return p, nil
}

// markNotALock shows that the key holds something else, and nothing of it.
func (s *scope) markNotALock() {
	s.holders = nil
	for _, l := range s.locks {
		l.Status.Key = s.key
		l.Status.Holder, l.Status.Waiting, l.Status.Blocked, l.Status.WaitingCount = nil, nil, nil, 0
		for _, c := range []string{locksv1.ConditionHeld, locksv1.ConditionConflict, locksv1.ConditionHolderStarted} {
			meta.RemoveStatusCondition(&l.Status.Conditions, c)
		}
		setCondition(l, locksv1.ConditionReady, metav1.ConditionFalse, "KeyInUse",
			"the Redis key holds data that is not a lock; choose another spec.key")
	}
}

// reread inspects the key again after it changed under a phase.
func (s *scope) reread(ctx context.Context) error {
	if err := s.readRedis(ctx); err != nil {
		return err
	}
	if s.redisErr != nil {
		return s.redisErr
	}
	return nil
}

// locksIn are the scope's live locks in the namespace.
func (s *scope) locksIn(namespace string) []*locksv1.DistributedLock {
	return inNamespace(s.locks, namespace)
}

// selectors are the scope's locks that select the pod.
func (s *scope) selectors(pod *corev1.Pod) []*locksv1.DistributedLock {
	var out []*locksv1.DistributedLock
	for _, l := range s.locksIn(pod.Namespace) {
		if selects(l, pod) {
			out = append(out, l)
		}
	}
	return out
}

// deletingIn are the scope's locks in the namespace being deleted.
func (s *scope) deletingIn(namespace string) []*locksv1.DistributedLock {
	return inNamespace(s.deleting, namespace)
}

// inNamespace are the locks of the namespace.
func inNamespace(locks []*locksv1.DistributedLock, namespace string) []*locksv1.DistributedLock {
	var out []*locksv1.DistributedLock
	for _, l := range locks {
		if l.Namespace == namespace {
			out = append(out, l)
		}
	}
	return out
}

// liftsGate reports whether the controller holds the key for the pod and
// the lock, live and in mode Grant, gates it: the grant lifts its gate.
func (s *scope) liftsGate(l *locksv1.DistributedLock, pod *corev1.Pod) bool {
	h, ok := s.heldBy(pod.UID)
	return ok && h.byController() && l.DeletionTimestamp.IsZero() && s.mayUse[l.Namespace] && grantsFor(l) &&
		l.Namespace == pod.Namespace && hasGate(pod, locksv1.GateFor(l.Name))
}

// guards reports whether a lock of the scope in mode Grant gates the pod:
// only a grant lifts a gate.
func (s *scope) guards(pod *corev1.Pod) bool {
	for _, l := range s.locksIn(pod.Namespace) {
		if grantsFor(l) && hasGate(pod, locksv1.GateFor(l.Name)) {
			return true
		}
	}
	return false
}

// observedRunning reports whether a lock of the scope in mode Observe
// selects the pod, and it runs: its client may take the key.
func (s *scope) observedRunning(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodRunning && !stopped(pod) &&
		slices.ContainsFunc(s.selectors(pod), func(l *locksv1.DistributedLock) bool { return !grantsFor(l) })
}

// gatedByAny reports whether a live lock of the scope gates the pod.
func (s *scope) gatedByAny(pod *corev1.Pod) bool {
	return slices.ContainsFunc(s.locksIn(pod.Namespace), func(l *locksv1.DistributedLock) bool {
		return hasGate(pod, locksv1.GateFor(l.Name))
	})
}

// heldBy is the Redis holder that is the pod, if any.
func (s *scope) heldBy(uid types.UID) (holder, bool) {
	for _, h := range s.holders {
		if h.podUID == uid {
			return h, true
		}
	}
	return holder{}, false
}

// holderPod is the pod holding the key in Redis, if it is in the scope.
func (s *scope) holderPod() *corev1.Pod {
	if len(s.holders) == 0 {
		return nil
	}
	return s.holders[0].pod
}

// grantsFor reports whether the controller takes the lock for its candidates
// (mode Grant), rather than leaving it to them (mode Observe).
func grantsFor(lock *locksv1.DistributedLock) bool { return !lock.Spec.Observes() }

// selects reports whether the lock selects the pod: by its candidate
// selector, or, for a lock without one, by the pod naming it in its label
// or annotation (locksv1.NamedLocks).
func selects(lock *locksv1.DistributedLock, pod client.Object) bool {
	if lock.Spec.Candidates == nil {
		return slices.Contains(locksv1.NamedLocks(pod.GetLabels(), pod.GetAnnotations()), lock.Name)
	}
	selector := selectors.get(lock)
	return selector != nil && selector.Matches(labels.Set(pod.GetLabels()))
}

func hasGate(pod *corev1.Pod, gate string) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == gate })
}

// keyMutex serialises reconciles per key.
type keyMutex struct {
	mu    sync.Mutex
	byKey map[string]*keyEntry
}

type keyEntry struct {
	mu    sync.Mutex
	users int
}

// lock locks the key and returns its unlock.
func (k *keyMutex) lock(key string) func() {
	k.mu.Lock()
	if k.byKey == nil {
		k.byKey = map[string]*keyEntry{}
	}
	e := k.byKey[key]
	if e == nil {
		e = &keyEntry{}
		k.byKey[key] = e
	}
	e.users++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.users--; e.users == 0 {
			delete(k.byKey, key)
		}
		k.mu.Unlock()
	}
}
