package controllers

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"

	"github.com/lockwarden/lockwarden/controllers/decide"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// scope is everything one reconcile of a key knows, loaded once.
type scope struct {
	// View is what the reconcile read of the key (its locks, by kind, and
	// their namespaces' right to the key; the pods; Redis's holders; this
	// process's memory of its grant), from which decide resolves who holds
	// it. The locks' statuses are computed in place.
	decide.View
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
	namespaces map[string]bool
	podByUID   func(context.Context, types.UID) (*corev1.Pod, error)
	// unwatched are the pods of the scope that the cache lacks, read from
	// the API server because the controller knows them as holders.
	unwatched map[types.UID]bool
	// gone are the known holders the API server says are gone: the only
	// holders missing from the scope that may be released.
	gone map[types.UID]types.NamespacedName

	// info is Redis's view of the key; View.Holders are its owners.
	info redislock.LockInfo
	// redisErr is why Redis could not be read; notALock is set when the key
	// holds data that is not a lock.
	redisErr error
	notALock bool

	// grantee is the pod the controller granted the key to and that has not
	// stopped: the grant is sticky until it stops. conflict is set when
	// somebody else holds the key in Redis meanwhile.
	grantee  *corev1.Pod
	conflict bool
	// taken is the hold this reconcile took in Redis for the grantee: the
	// writer gives it back if it must not be used (confirm, writeRecord). adopted is the
	// level it added to a hold it adopted instead: given back only if the
	// check past the cache finds another grant out. newGrant is set when
	// the take is a new grant, not the same grant taken again.
	taken, adopted *handle
	newGrant       bool
	// notReady, if set, is why the key's locks are not Ready, though Redis
	// answered; failed, if set, is why a phase failed (failure).
	notReady *condition
	failed   *failure
	// described is set once the locks' statuses were computed from what
	// this reconcile read (patchStatus stamps observedGeneration then).
	described bool
	// gateMemo is gateLocksOf's memory, and candidateAt each candidate's
	// place in the waiting order.
	gateMemo    map[types.UID]gateResult
	candidateAt map[types.UID]int
	// after is how soon the key must be looked at again, or 0.
	after time.Duration
	// announcements are the Events sent once the statuses they are about
	// are written (announce.go).
	announcements []announcement
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

// unnamed reports whether no lock names the key, in any state.
func (s *scope) unnamed() bool { return len(s.All()) == 0 && len(s.ungiven) == 0 }

// requeue asks for another look at the key within d.
func (s *scope) requeue(d time.Duration) {
	if s.after == 0 || d < s.after {
		s.after = d
	}
}

// holder is an owner of the key in Redis (decide.Holder).
type holder = decide.Holder

// ownerPattern is Redisson's "<id>:<n>". A field of any other shape means
// the key is some other hash, whose fields are none of the tenant's business.
var ownerPattern = regexp.MustCompile(`^[^:\s]+:[0-9]+$`)

// loadScope reads the locks naming the key, their pods and Redis. Once the
// locks are read, the scope is returned with any error that follows, so
// that their statuses can show it (readFailed).
func (r *DistributedLockReconciler) loadScope(ctx context.Context, key string) (*scope, error) {
	s := &scope{
		View:       decide.View{Key: key, ByUID: map[types.UID]*corev1.Pod{}, MayUse: map[string]bool{}, Selects: selectsPod},
		before:     map[types.NamespacedName]*locksv1.DistributedLock{},
		namespaces: map[string]bool{}, unwatched: map[types.UID]bool{}, gone: map[types.UID]types.NamespacedName{},
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
			s.Deleting = append(s.Deleting, l)
		case !r.Keys.Permits(l.Namespace, key):
			s.Revoked = append(s.Revoked, l)
		default:
			s.Locks = append(s.Locks, l)
		}
		s.namespaces[l.Namespace] = true
		s.MayUse[l.Namespace] = r.Keys.Permits(l.Namespace, key)
		s.before[client.ObjectKeyFromObject(l)] = l.DeepCopy()
	}
	// A hold this process renews stays in the scope, its pod with it, until
	// that pod stops, even once no lock of its namespace names the key (a
	// finalizer removed by hand): it is then released, never renewed for
	// ever. Its namespace takes no other part in the key (MayUse).
	if g := r.grants.get(key); g != nil {
		s.namespaces[g.Pod.Namespace] = true
	}
	for _, l := range s.All() {
		pods, err := r.podsOf(ctx, l)
		if err != nil {
			return s, err
		}
		for _, p := range pods {
			s.addPod(p)
		}
	}
	for _, p := range s.pods {
		if slices.ContainsFunc(s.SelectorsOf(p), decide.GrantsFor) {
			s.Candidates = append(s.Candidates, p)
		}
	}
	slices.SortFunc(s.Candidates, func(a, b *corev1.Pod) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	s.candidateAt = make(map[types.UID]int, len(s.Candidates))
	for i, p := range s.Candidates {
		s.candidateAt[p.UID] = i
	}
	// After the candidates: a known holder found only now is none.
	if err := r.addKnownHolders(ctx, s); err != nil {
		return s, err
	}
	c, err := r.Locks.For(defaultTerms)
	if isRedisError(err) {
		s.redisErr = err
		return s, nil
	}
	if err != nil {
		return s, err
	}
	s.client = c
	if err := s.readRedis(ctx); err != nil {
		return s, err
	}
	r.holderToken(s)
	if g := r.grants.get(key); g != nil {
		s.Memory = g.PodUID
	}
	s.grantee = s.Resolve().Grantee
	return s, nil
}

// readRedis inspects the key and maps its owners to pods.
func (s *scope) readRedis(ctx context.Context) error {
	info, err := s.client.Inspect(ctx, s.Key)
	switch {
	case err != nil && strings.Contains(err.Error(), "WRONGTYPE"):
		s.markNotALock()
		return nil
	case isRedisError(err):
		s.redisErr = err
		return nil
	case err != nil: // an invalid name, which admission refuses
		return err
	}
	s.info, s.Holders = info, nil
	for _, h := range info.Holders {
		owner := string(h.Owner)
		if !ownerPattern.MatchString(owner) {
			s.markNotALock()
			return nil
		}
		uid := types.UID(owner[:strings.LastIndexByte(owner, ':')])
		pod, err := s.ownerPod(ctx, uid)
		if err != nil {
			return err
		}
		s.Holders = append(s.Holders, holder{Owner: string(h.Owner), PodUID: uid, Pod: pod})
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
	if len(s.Holders) == 0 || s.info.Token != 0 {
		return
	}
	h := s.Holders[0]
	if g := r.grants.get(s.Key); g != nil && g.PodUID == h.PodUID && g.hold != nil && h.ByController() {
		s.info.Token = g.hold.Token()
		return
	}
	for _, l := range s.All() {
		if st := l.Status.Holder; st != nil && st.OwnerID == h.Owner {
			s.info.Token = max(s.info.Token, st.Token)
		}
		if g := l.Status.Grant; g != nil && h.ByController() && g.PodUID == string(h.PodUID) {
			s.info.Token = max(s.info.Token, g.Token)
		}
	}
}

// addPod adds a pod to the scope, once.
func (s *scope) addPod(p *corev1.Pod) {
	if s.ByUID[p.UID] == nil {
		s.pods = append(s.pods, p)
		s.ByUID[p.UID] = p
	}
}

// ownerPod is the pod of the scope's namespaces with the UID an owner ID in
// Redis starts with, or nil: it is added to the scope if it was not in it.
func (s *scope) ownerPod(ctx context.Context, uid types.UID) (*corev1.Pod, error) {
	if p := s.ByUID[uid]; p != nil {
		return p, nil
	}
	p, err := s.podByUID(ctx, uid)
	if err != nil || p == nil || !s.namespaces[p.Namespace] {
		return nil, err
	}
	s.addPod(p)
	return p, nil
}

// markNotALock records that the key holds data that is not a lock, so
// nothing of it is shown or acted on (computeStatuses shows KeyInUse).
func (s *scope) markNotALock() {
	s.notALock, s.Holders = true, nil
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

// observedRunning reports whether a lock of the scope in mode Observe
// selects the pod, and it runs: its client may take the key.
func (s *scope) observedRunning(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodRunning && !decide.Stopped(pod) &&
		slices.ContainsFunc(s.SelectorsOf(pod), func(l *locksv1.DistributedLock) bool { return !decide.GrantsFor(l) })
}

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

// selectsPod is selects for a pod, as decide.View asks it.
func selectsPod(lock *locksv1.DistributedLock, pod *corev1.Pod) bool { return selects(lock, pod) }

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
