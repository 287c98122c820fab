package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// liftGateOf removes the lock's gate from the pod, writing the token
// annotation with it when token is not "", as the controller's ungate does.
func liftGateOf(pod *corev1.Pod, lock, token string) error {
	p := &corev1.Pod{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(pod), p); err != nil {
		return err
	}
	p.Spec.SchedulingGates = slices.DeleteFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == gateFor(lock) })
	if token != "" {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[locksv1.TokenAnnotationPrefix+lock] = token
	}
	return k8s.Update(context.Background(), p)
}

// The admission policy of config/admission refuses to lift a lock's gate
// with a fencing token below the highest the lock records, and the record
// never decreases. A lift that carries no token (by hand) is not checked.
func TestFencingPolicyRefusesAStaleLift(t *testing.T) {
	ns := newNamespace(t)
	lock := createLock(t, ns, "fenced", "job")
	l := getLock(t, lock)
	l.Status.HighestToken = 100
	if err := k8s.Status().Update(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	l.Status.HighestToken = 99
	if err := k8s.Status().Update(context.Background(), l); !apierrors.IsInvalid(err) {
		t.Fatalf("lowering status.highestToken: %v, want Invalid", err)
	}

	stale := createPod(t, ns, "stale", "job", gatedBy("fenced"))
	eventually(t, "the policy to refuse a lift with token 5", func() bool {
		err := liftGateOf(stale, "fenced", "5")
		return err != nil && strings.Contains(err.Error(), "below 100")
	})
	if !gatedWith(getPod(t, stale), gateFor("fenced")) {
		t.Fatal("the stale lift went through")
	}
	if err := liftGateOf(createPod(t, ns, "fresh", "job", gatedBy("fenced")), "fenced", "100"); err != nil {
		t.Fatalf("a lift with the highest token was refused: %v", err)
	}
	if err := liftGateOf(createPod(t, ns, "manual", "job", gatedBy("fenced")), "fenced", ""); err != nil {
		t.Fatalf("a lift by hand, with no token, was refused: %v", err)
	}
}

// Case 10: a manager paused mid-grant, for longer than its grant lasts,
// lifts no gate when it wakes. Manager A takes the key in Redis for pod x,
// and is paused (its API writes held, its Redis cut off) just before it
// writes, at pauseAt: the record of its grant, or x's ungate. Meanwhile
// Redis restarts empty, a selector edit leaves x out, and manager B settles
// the key: with no record of A's grant, it grants y; with the record, it
// keeps x's grant (sticky), whatever the selector says. When A wakes, the
// API server refuses its stale write, and never do both x and y run.
func TestAPausedManagerLiftsNoGate(t *testing.T) {
	for _, pauseAt := range []string{"the fencing record", "the ungate"} {
		t.Run(strings.ReplaceAll(pauseAt, " ", "-"), func(t *testing.T) {
			pausedManagerScenario(t, pauseAt)
		})
	}
}

func pausedManagerScenario(t *testing.T, pauseAt string) {
	srv := redistest.Start(t)
	cut := redistest.StartProxy(t, srv.Addr)
	ns := newNamespace(t)
	var armed atomic.Bool
	armed.Store(true)
	paused, wake, woke := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	// A's first write of the kind pauseAt names, for pod x's grant, stops
	// A: its Redis goes quiet at once, its write waits for the wake.
	pauses := func(obj client.Object, sub string) bool {
		if pauseAt == "the ungate" {
			pod, ok := obj.(*corev1.Pod)
			return ok && pod.Name == "x" && sub == "" && !gatedWith(pod, gateFor("singleton"))
		}
		_, ok := obj.(*locksv1.DistributedLock)
		return ok && sub == "status" && obj.GetNamespace() == ns
	}
	a := startManagerOn(t, managerConfig{redisAddr: cut.Addr, namespaces: []string{ns},
		intercept: func(obj client.Object, sub string) func(error) {
			if !pauses(obj, sub) || !armed.CompareAndSwap(true, false) {
				return nil
			}
			cut.Cut()
			close(paused)
			<-wake
			return func(err error) { woke <- err }
		}})
	x := createPod(t, ns, "x", "job", gatedBy("singleton"), withLabels(map[string]string{"app": "job", "run": "x"}))
	y := createPod(t, ns, "y", "job", gatedBy("singleton"), withLabels(map[string]string{"app": "job", "run": "y"}))
	lock := createLock(t, ns, "singleton", "job")
	select {
	case <-paused:
	case <-time.After(20 * time.Second):
		t.Fatal("manager A never came to " + pauseAt)
	}
	waitForFencing(t)

	// During the pause: Redis restarts without its data, and the selector
	// is edited to leave x out, which takes effect at the next grant.
	srv.Stop()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	updateLock(t, lock, func(l *locksv1.DistributedLock) { l.Spec.Candidates.MatchLabels["run"] = "y" })
	startManagerOn(t, managerConfig{redisAddr: srv.Addr, namespaces: []string{ns}})
	ungated := func(p *corev1.Pod) bool { return !gatedWith(getPod(t, p), gateFor("singleton")) }
	if pauseAt == "the fencing record" {
		eventually(t, "manager B, with no record of A's grant, to grant y", func() bool { return ungated(y) })
	} else {
		eventually(t, "manager B to keep x's recorded grant", func() bool { return ungated(x) })
	}

	close(wake)
	select {
	case err := <-woke:
		if err == nil {
			t.Fatalf("A's stale write after %s went through", pauseAt)
		}
		t.Logf("A's stale write was refused: %v", err)
	case <-time.After(20 * time.Second):
		if pauseAt == "the ungate" {
			t.Fatal("A's ungate never returned")
		}
	}
	a.stop()
	settle()
	if ungated(x) && ungated(y) {
		t.Fatal("x and y were both ungated")
	}
}

// waitForFencing waits until the API server enforces the fencing policy,
// which it does a moment after the policy is created.
func waitForFencing(t *testing.T) {
	t.Helper()
	ns := newNamespace(t)
	lock := createLock(t, ns, "probe", "probe")
	if err := updateLockStatus(t, lock, func(l *locksv1.DistributedLock) { l.Status.HighestToken = 2 }); err != nil {
		t.Fatal(err)
	}
	probe := createPod(t, ns, "probe", "probe", gatedBy("probe"))
	eventually(t, "the fencing policy to be enforced", func() bool { return liftGateOf(probe, "probe", "1") != nil })
}

// A lock deleted while its manager was stopped between the record of a
// grant, which says the lock lifted its gate, and the lift itself: the pod
// still carries the gate. The lock waits for the pod to stop before it
// goes, so the pod must get past the gate. The manager that takes over
// finishes the lift the record promised, under the grant it holds for the
// pod; the lock goes once the pod stops. Before, the pod waited for a gate
// that a lock being deleted would not lift, and the lock for a pod that
// could never start (the fault run, seed 1795662721169089640). In the
// second case a higher fencing token is recorded for the key meanwhile (as
// when Redis lost its counter and this manager's clock is behind): a lift
// with A's hold would be refused, so the hold is given back and taken again
// until the clock has passed the record, and then the lift is made.
func TestALockDeletedBeforeItsRecordedLiftFinishesIt(t *testing.T) {
	for _, behind := range []bool{false, true} {
		name := "the hold A took"
		if behind {
			name = "a hold whose token is behind the record"
		}
		t.Run(strings.ReplaceAll(name, " ", "-"), func(t *testing.T) { deletedBeforeLiftScenario(t, behind) })
	}
}

func deletedBeforeLiftScenario(t *testing.T, behind bool) {
	srv := redistest.Start(t)
	cut := redistest.StartProxy(t, srv.Addr)
	ns := newNamespace(t)
	var armed atomic.Bool
	armed.Store(true)
	paused, wake := make(chan struct{}), make(chan struct{})
	// A stops at x's ungate, after recording it: its Redis goes quiet at
	// once, and its write waits for the wake.
	a := startManagerOn(t, managerConfig{redisAddr: cut.Addr, namespaces: []string{ns},
		intercept: func(obj client.Object, sub string) func(error) {
			pod, ok := obj.(*corev1.Pod)
			if !ok || pod.Name != "x" || sub != "" || gatedWith(pod, gateFor("singleton")) || !armed.CompareAndSwap(true, false) {
				return nil
			}
			cut.Cut()
			close(paused)
			<-wake
			return nil
		}})
	resume := sync.OnceFunc(func() { close(wake) })
	t.Cleanup(resume) // before A stops
	x := createPod(t, ns, "x", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job")
	select {
	case <-paused:
	case <-time.After(20 * time.Second):
		t.Fatal("manager A never came to x's ungate")
	}
	if g := getLock(t, lock).Status.Grant; g == nil || g.PodName != "x" || !g.GateLifted {
		t.Fatalf("the lock's record before the ungate: %+v, want x's grant with its gate lifted", g)
	}
	if !gatedWith(getPod(t, x), gateFor("singleton")) {
		t.Fatal("x was ungated while A was stopped before its ungate")
	}

	deleteLock(t, lock)
	highest := getLock(t, lock).Status.HighestToken
	if behind {
		// Tokens are the clock in microseconds, or one more than the last:
		// this record is 4 s ahead of any token Redis gives now.
		highest = time.Now().Add(4 * time.Second).UnixMicro()
		if err := updateLockStatus(t, lock, func(l *locksv1.DistributedLock) { l.Status.HighestToken = highest }); err != nil {
			t.Fatal(err)
		}
	}
	startManagerOn(t, managerConfig{redisAddr: srv.Addr, namespaces: []string{ns}})
	eventually(t, "manager B to finish the lift that the deleted lock's record promised", func() bool {
		return !gatedWith(getPod(t, x), gateFor("singleton"))
	})
	if token, err := strconv.ParseInt(getPod(t, x).Annotations[locksv1.TokenAnnotationPrefix+"singleton"], 10, 64); err != nil || token < highest {
		t.Fatalf("x was ungated with fencing token %d (%v), want one at least %d, the lock's record", token, err, highest)
	}
	if lockGone(t, lock) {
		t.Fatal("the lock went while x, whose gate it lifted, had not stopped")
	}
	resume()
	a.stop()

	eventually(t, "x's run to end", func() bool {
		p := getPod(t, x)
		p.Status.Phase = corev1.PodSucceeded
		return k8s.Status().Update(context.Background(), p) == nil
	})
	eventually(t, "the lock to go once x stopped", func() bool { return lockGone(t, lock) })
	c, err := redislock.New(srv.Client(t), redislock.Options{ID: "inspector"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if info, err := c.Inspect(context.Background(), lockKey(lock)); err != nil || info.Held() {
		t.Fatalf("the key once the lock went: %+v, %v; want it free", info, err)
	}
}

// No gate is lifted before the lock's status records the grant it comes
// from (recordGrant): the record is what keeps a grant sticky, so a lift
// without it can be followed by a second grant of the key. Here the status
// records pod a's grant, while the key is held in Redis for pod b (another
// manager, acting on an older view, took it). Just after the manager reads
// its scope, a stops: the manager's check past the cache then finds a's
// grant over, but the record of b's grant cannot be written yet, since the
// status still names a's grant, which the scope saw running. The oracle is
// the API server's record at the moment of each ungate, not the
// controller's reasoning. Before, b was ungated with a's grant recorded
// (the fault run, seed 1795666297250708953).
func TestNoGateIsLiftedBeforeItsGrantIsRecorded(t *testing.T) {
	srv := redistest.Start(t)
	ns := newNamespace(t)
	a := createPod(t, ns, "a", "job")
	b := createPod(t, ns, "b", "job", gatedBy("singleton"))
	lock := newLock(ns, "singleton", "job")
	if err := k8s.Create(context.Background(), lock); err != nil {
		t.Fatal(err)
	}
	if err := updateLockStatus(t, lock, func(l *locksv1.DistributedLock) {
		l.Status.HighestToken = 1
		l.Status.Grant = &locksv1.LockGrant{PodName: "a", PodUID: string(a.UID), Token: 1, GateLifted: true, Since: metav1.Now()}
	}); err != nil {
		t.Fatal(err)
	}
	other, err := redislock.New(srv.Client(t), redislock.Options{ID: "other-manager", WatchdogLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	m, err := other.NewMutex(lockKey(lock), &redislock.MutexOptions{Owner: redislock.Owner(string(b.UID) + ":0")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryLock(context.Background(), 0); err != nil {
		t.Fatal(err)
	}

	var (
		h          *harness
		ready      = make(chan struct{})
		stoppedA   atomic.Bool
		unrecorded atomic.Value
	)
	h = startManagerOn(t, managerConfig{redisAddr: srv.Addr, namespaces: []string{ns},
		intercept: func(obj client.Object, sub string) func(error) {
			switch o := obj.(type) {
			case *locksv1.DistributedLock:
				// The lock's first write, its finalizer, comes after the
				// scope is read: a stops now, and the manager's cache sees it.
				if sub == "" && stoppedA.CompareAndSwap(false, true) {
					<-ready
					p := getPod(t, a)
					p.Status.Phase = corev1.PodSucceeded
					if err := k8s.Status().Update(context.Background(), p); err != nil {
						t.Error(err)
					}
					for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
						seen := &corev1.Pod{}
						if err := h.cache.Get(context.Background(), client.ObjectKeyFromObject(a), seen); err == nil && seen.Status.Phase == corev1.PodSucceeded {
							break
						}
					}
				}
			case *corev1.Pod:
				if o.Name == "b" && !gatedWith(o, gateFor("singleton")) {
					if g := getLock(t, lock).Status.Grant; g == nil || g.PodUID != string(b.UID) || !g.GateLifted {
						unrecorded.Store(fmt.Sprintf("%+v", g))
					}
				}
			}
			return nil
		}})
	close(ready)
	eventually(t, "b to be ungated once a stopped", func() bool { return !gatedWith(getPod(t, b), gateFor("singleton")) })
	if !stoppedA.Load() {
		t.Fatal("the manager wrote no finalizer: the test stopped a at no point")
	}
	if v := unrecorded.Load(); v != nil {
		t.Fatalf("b was ungated while the lock's status recorded %v, not b's grant", v)
	}
}

// A manager that gives back a hold it took, because its record of the grant
// failed, undoes only its own take. Another manager may hold the same
// ownership of the key for the same pod: the owner ID is the pod's, so a
// take by two managers re-enters one hold. Here, just before manager A
// records x's grant, another manager takes the key for x too, records the
// grant with its gate lifted, and so makes A's record fail on the
// resourceVersion. A gives its hold back. The other manager's ownership
// must survive it: x runs under it, and its gate is lifted with its token.
// Before, A force-released every level of x's ownership, so the key was
// free in Redis while the record said x's gate was lifted, and x ran under
// a second ownership with another token.
func TestAGivenBackHoldLeavesAnotherManagersHoldOfTheGrant(t *testing.T) {
	srv := redistest.Start(t)
	ns := newNamespace(t)
	other := anotherManager(t, srv, newLock(ns, "singleton", "job"))
	x := createPod(t, ns, "x", "job", gatedBy("singleton"))
	var (
		armed     atomic.Bool
		otherHold atomic.Pointer[redislock.Hold]
		refused   = make(chan error, 1)
	)
	armed.Store(true)
	startManagerOn(t, managerConfig{redisAddr: srv.Addr, namespaces: []string{ns},
		intercept: func(obj client.Object, sub string) func(error) {
			// A's first status write once it holds the key for x is its
			// record of the grant it just took.
			l, ok := obj.(*locksv1.DistributedLock)
			if !ok || sub != "status" || !armed.Load() {
				return nil
			}
			if info, err := other.Inspect(context.Background(), lockKey(l)); err != nil || !info.Held() || info.Holders[0].Owner != redislock.Owner(string(x.UID)+":0") {
				return nil
			}
			armed.Store(false)
			hold, err := takeFor(other, l, x)
			if err != nil {
				t.Errorf("the other manager's take of x's key: %v", err)
				return nil
			}
			otherHold.Store(hold)
			if err := updateLockStatus(t, l, func(l *locksv1.DistributedLock) {
				l.Status.HighestToken = max(l.Status.HighestToken, hold.Token())
				l.Status.Grant = &locksv1.LockGrant{PodName: "x", PodUID: string(x.UID), Token: hold.Token(), GateLifted: true, Since: metav1.Now()}
			}); err != nil {
				t.Error(err)
			}
			return func(err error) { refused <- err }
		}})
	createLock(t, ns, "singleton", "job")
	select {
	case err := <-refused:
		if !apierrors.IsConflict(err) {
			t.Fatalf("manager A's record, written after the other manager's: %v, want a conflict", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("manager A never recorded x's grant")
	}
	hold := otherHold.Load()
	eventually(t, "x to be ungated", func() bool { return !gatedWith(getPod(t, x), gateFor("singleton")) })

	if err := hold.Err(); err != nil {
		t.Fatalf("the other manager's hold of x's grant ended: %v", err)
	}
	if err := hold.Refresh(context.Background()); err != nil {
		t.Fatalf("the other manager's hold of x's grant, renewed: %v", err)
	}
	want := strconv.FormatInt(hold.Token(), 10)
	if got := getPod(t, x).Annotations[locksv1.TokenAnnotationPrefix+"singleton"]; got != want {
		t.Fatalf("x was ungated with fencing token %s, want %s, the recorded grant's: the key was freed and taken again", got, want)
	}
}

// A hold of a pod's grant that the manager adopts rather than takes (a
// manager took it before a restart, or took it beside this one and is still
// renewing it) may carry a fencing token below the key's record: Redis lost
// its counter, and that manager's clock is behind. The admission policy
// refuses a lift with it, so the whole ownership is given back, whoever
// renews it, and the key is taken again until the clock has passed the
// record. Before, only a hold taken by the same reconcile was given back:
// the adopted one was renewed for ever, and its lift refused for ever.
func TestAnAdoptedHoldBehindTheRecordIsTakenAgainBeforeTheLift(t *testing.T) {
	srv := redistest.Start(t)
	waitForFencing(t)
	ns := newNamespace(t)
	x := createPod(t, ns, "x", "job", gatedBy("singleton"))
	lock := newLock(ns, "singleton", "job")
	if err := k8s.Create(context.Background(), lock); err != nil {
		t.Fatal(err)
	}
	// Tokens are the clock in microseconds, or one more than the last:
	// this record is 4 s ahead of any token Redis gives now.
	highest := time.Now().Add(4 * time.Second).UnixMicro()
	if err := updateLockStatus(t, lock, func(l *locksv1.DistributedLock) { l.Status.HighestToken = highest }); err != nil {
		t.Fatal(err)
	}
	behind, err := takeFor(anotherManager(t, srv, lock), lock, x)
	if err != nil {
		t.Fatal(err)
	}
	if behind.Token() >= highest {
		t.Fatalf("the other manager's token %d is not behind the record %d", behind.Token(), highest)
	}

	startManagerOn(t, managerConfig{redisAddr: srv.Addr, namespaces: []string{ns}})
	eventually(t, "x to be ungated", func() bool { return !gatedWith(getPod(t, x), gateFor("singleton")) })
	if token, err := strconv.ParseInt(getPod(t, x).Annotations[locksv1.TokenAnnotationPrefix+"singleton"], 10, 64); err != nil || token < highest {
		t.Fatalf("x was ungated with fencing token %d (%v), want one at least %d, the lock's record", token, err, highest)
	}
	if err := behind.Refresh(context.Background()); err == nil {
		t.Fatal("the ownership whose token is behind the record still holds the key")
	}
}

// A manager that renews a pod's grant, and whose ownership Redis lost
// (here deleted; a restart without its data does the same) before its
// watchdog noticed, adopts the ownership another manager took for the same
// pod meanwhile: it adds a level of its own to it. Before, it took its own
// live-looking hold for that ownership, recorded the new token and renewed
// nothing of it, so the other manager's give-back of its take left the key
// free in Redis under x's recorded, lifted grant.
func TestAManagerAdoptsTheOwnershipRedisShowsNotTheOneItRenews(t *testing.T) {
	srv := redistest.Start(t)
	ns := newNamespace(t)
	// A long renewal interval: the manager's watchdog does not notice the
	// loss during the test.
	lease, renew := time.Minute, 55*time.Second
	x := createPod(t, ns, "x", "job", gatedBy("singleton"))
	startManagerOn(t, managerConfig{redisAddr: srv.Addr, namespaces: []string{ns}})
	lock := createLock(t, ns, "singleton", "job", func(l *locksv1.DistributedLock) {
		l.Spec.LeaseDuration, l.Spec.RenewInterval = &metav1.Duration{Duration: lease}, &metav1.Duration{Duration: renew}
	})
	eventually(t, "x to be ungated", func() bool { return !gatedWith(getPod(t, x), gateFor("singleton")) })

	if err := srv.Client(t).Del(context.Background(), lockKey(lock)).Err(); err != nil {
		t.Fatal(err)
	}
	other := anotherManager(t, srv, lock)
	take, err := takeFor(other, lock, x)
	if err != nil {
		t.Fatal(err)
	}
	// The key's next event: x changes.
	labelPod(t, x, "touched", "1")
	eventually(t, "the manager to record the other manager's token", func() bool {
		return getLock(t, lock).Status.HighestToken == take.Token()
	})

	if err := take.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if info, err := other.Inspect(context.Background(), lockKey(lock)); err != nil || !info.Held() || info.Token != take.Token() {
		t.Fatalf("x's key once the other manager gave its take back: %+v, %v; want it still held, with token %d", info, err, take.Token())
	}
}

// A manager that adopted a hold it must not use gives its level back, as it
// does a take. Here Redis holds the key for x, taken by a manager acting on
// an old view, while the status records y's grant, which the manager's view
// did not show yet when it adopted x's hold: its check past the cache finds
// y's grant. Once the other manager gives its take back too, the key is free
// and is taken again for y, whose grant it is. Before, the adopted level was
// kept and renewed, and the key stayed x's until y stopped.
func TestAnAdoptedLevelIsGivenBackWhenTheGrantCannotBeChecked(t *testing.T) {
	srv := redistest.Start(t)
	ns := newNamespace(t)
	x := createPod(t, ns, "x", "job", gatedBy("singleton"))
	y := createPod(t, ns, "y", "job")
	lock := createLock(t, ns, "singleton", "job")
	other := anotherManager(t, srv, lock)
	take, err := takeFor(other, lock, x)
	if err != nil {
		t.Fatal(err)
	}

	var armed atomic.Bool
	armed.Store(true)
	recorded := make(chan struct{})
	startManagerOn(t, managerConfig{redisAddr: srv.Addr, namespaces: []string{ns},
		intercept: func(obj client.Object, sub string) func(error) {
			// The lock's finalizer comes after the scope is read: y's grant
			// is recorded just after it.
			if _, ok := obj.(*locksv1.DistributedLock); !ok || sub != "" || !armed.CompareAndSwap(true, false) {
				return nil
			}
			return func(error) {
				defer close(recorded)
				if err := updateLockStatus(t, lock, func(l *locksv1.DistributedLock) {
					l.Status.HighestToken = max(l.Status.HighestToken, take.Token())
					l.Status.Grant = &locksv1.LockGrant{PodName: "y", PodUID: string(y.UID), Token: take.Token(), GateLifted: true, Since: metav1.Now()}
				}); err != nil {
					t.Error(err)
				}
			}
		}})
	select {
	case <-recorded:
	case <-time.After(20 * time.Second):
		t.Fatal("the manager never wrote the lock's finalizer")
	}
	settle()
	if err := take.Unlock(context.Background()); err != nil {
		t.Fatalf("the other manager's give-back: %v", err)
	}
	eventually(t, "the key to be taken again for y", func() bool {
		info, err := other.Inspect(context.Background(), lockKey(lock))
		return err == nil && len(info.Holders) == 1 && info.Holders[0].Owner == redislock.Owner(string(y.UID)+":0")
	})
	if !gatedWith(getPod(t, x), gateFor("singleton")) {
		t.Fatal("x was ungated while y's grant is recorded")
	}
}

// anotherManager is a lock client that takes keys as another manager
// replica would for the lock: under the lock's lease terms, so that the
// manager under test re-enters, rather than replaces, an ownership it took.
func anotherManager(t *testing.T, srv *redistest.Server, lock *locksv1.DistributedLock) *redislock.Client {
	t.Helper()
	lease := lock.Spec.LeaseDuration.Duration
	renew := lease / 3
	if lock.Spec.RenewInterval != nil {
		renew = lock.Spec.RenewInterval.Duration
	}
	c, err := redislock.New(srv.Client(t), redislock.Options{ID: "other-manager", WatchdogLease: lease, RenewInterval: renew})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// takeFor takes the lock's key for the pod, as a manager's grant does.
func takeFor(c *redislock.Client, lock *locksv1.DistributedLock, pod *corev1.Pod) (*redislock.Hold, error) {
	m, err := c.NewMutex(lockKey(lock), &redislock.MutexOptions{Owner: redislock.Owner(string(pod.UID) + ":0")})
	if err != nil {
		return nil, err
	}
	return m.TryLock(context.Background(), 0)
}

// A hold that is gone by the time the manager adopts it, the key taken by
// somebody else meanwhile, lifts no gate: the manager's read of Redis is
// over. Here another manager took the key for x and stopped; just after the
// manager reads its scope, x's hold goes and a client of another owner
// takes the key. Before, the adoption's failure was taken for "the next
// reconcile will see", and this one went on with its old read: it recorded
// x's grant and lifted x's gate while the other owner held the key.
func TestAHoldLostBeforeItsAdoptionLiftsNoGate(t *testing.T) {
	srv := redistest.Start(t)
	ns := newNamespace(t)
	x := createPod(t, ns, "x", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job")
	other := anotherManager(t, srv, lock)
	if _, err := takeFor(other, lock, x); err != nil {
		t.Fatal(err)
	}
	app, err := redislock.New(srv.Client(t), redislock.Options{ID: "app"})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	appMutex, err := app.NewMutex(lockKey(lock), nil)
	if err != nil {
		t.Fatal(err)
	}

	var armed atomic.Bool
	armed.Store(true)
	taken := make(chan *redislock.Hold, 1)
	startManagerOn(t, managerConfig{redisAddr: srv.Addr, namespaces: []string{ns},
		intercept: func(obj client.Object, sub string) func(error) {
			// The lock's finalizer comes after the scope is read.
			if _, ok := obj.(*locksv1.DistributedLock); !ok || sub != "" || !armed.CompareAndSwap(true, false) {
				return nil
			}
			return func(error) {
				if _, err := other.ForceReleaseClient(context.Background(), lockKey(lock), string(x.UID)); err != nil {
					t.Error(err)
				}
				hold, err := appMutex.TryLock(context.Background(), 0)
				if err != nil {
					t.Errorf("the other owner's take: %v", err)
				}
				taken <- hold
			}
		}})
	var hold *redislock.Hold
	select {
	case hold = <-taken:
	case <-time.After(20 * time.Second):
		t.Fatal("the manager never wrote the lock's finalizer")
	}
	settle()
	if !gatedWith(getPod(t, x), gateFor("singleton")) {
		t.Fatal("x was ungated while another owner held the key")
	}
	if hold != nil {
		if err := hold.Refresh(context.Background()); err != nil {
			t.Fatalf("the other owner's hold: %v", err)
		}
	}
}
