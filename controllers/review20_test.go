package controllers_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// pausingReader is the API reader of a manager that is paused right after
// the check past the cache that follows its take of the key: its first Get
// of a lock returns, then cuts its Redis off and waits for wake.
type pausingReader struct {
	client.Reader
	cut    *redistest.Proxy
	armed  atomic.Bool
	paused chan struct{}
	wake   chan struct{}
}

func (p *pausingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := p.Reader.Get(ctx, key, obj, opts...)
	if _, ok := obj.(*locksv1.DistributedLock); ok && p.armed.CompareAndSwap(true, false) {
		p.cut.Cut()
		close(p.paused)
		<-p.wake
	}
	return err
}

// Review finding C1: a manager paused between its check past the cache and
// its lift, for longer than its hold lasts, decided on a view that is stale
// when it wakes: another manager granted the key to another pod since, with
// a higher token, recorded first. Its record and its lift are refused.
// (Before the fix, the check came before the take, and a fresh token let a
// stale decision through the fence.)
func TestReviewStaleDecisionWithFreshTokenPassesTheFence(t *testing.T) {
	waitForFencing(t)
	ns := newNamespace(t)
	srv := redistest.Start(t)
	cut := redistest.StartProxy(t, srv.Addr)
	direct, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	reader := &pausingReader{Reader: direct, cut: cut, paused: make(chan struct{}), wake: make(chan struct{})}
	reader.armed.Store(true)
	startManagerOn(t, managerConfig{redisAddr: cut.Addr, namespaces: []string{ns}},
		func(r *controllers.DistributedLockReconciler) { r.APIReader = reader })
	z := createPod(t, ns, "z", "job", gatedBy("singleton"), withLabels(map[string]string{"app": "job", "run": "z"}))
	time.Sleep(1100 * time.Millisecond) // z is the oldest candidate
	x := createPod(t, ns, "x", "job", gatedBy("singleton"), withLabels(map[string]string{"app": "job", "run": "x"}))
	lock := createLock(t, ns, "singleton", "job")
	key := lockKey(lock)
	select {
	case <-reader.paused:
	case <-time.After(20 * time.Second):
		t.Fatal("manager A never checked for a grant out")
	}
	defer close(reader.wake)
	// While A is paused: its hold of z lapses, a selector edit leaves z
	// out, and manager B grants x, which runs.
	updateLock(t, lock, func(l *locksv1.DistributedLock) { l.Spec.Candidates.MatchLabels["run"] = "x" })
	eventually(t, "A's hold of z to lapse", func() bool { return !holdsOn(t, srv, key, z) })
	startManagerOn(t, managerConfig{redisAddr: srv.Addr, namespaces: []string{ns}})
	eventually(t, "manager B to grant x", func() bool {
		return holdsOn(t, srv, key, x) && !gatedWith(getPod(t, x), gateFor("singleton"))
	})
	bind(t, x)
	setContainers(t, x, corev1.PodRunning, running)

	reader.wake <- struct{}{} // A wakes
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if zp := getPod(t, z); !gatedWith(zp, gateFor("singleton")) {
			t.Fatalf("A ungated z with token %s (lock's highestToken %d) while x, ungated by B, runs",
				zp.Annotations[locksv1.TokenAnnotationPrefix+"singleton"], getLock(t, lock).Status.HighestToken)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// holdsOn reports whether the controller holds the key for the pod on the
// server.
func holdsOn(t *testing.T, srv *redistest.Server, key string, pod *corev1.Pod) bool {
	t.Helper()
	c, err := redislock.New(srv.Client(t), redislock.Options{ID: "inspector"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.Inspect(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return len(info.Holders) == 1 && string(info.Holders[0].Owner) == string(pod.UID)+":0"
}

// The fencing counter lives 24 h after the last token was taken
// (token_retention), and a lock held longer (a leader) outlives it. Inspect
// then reports token 0, and the controller writes 0 as the holder's token
// on the pod and in the status, and resets its since-time.
func TestReviewHolderTokenDropsToZeroWhenTheCounterExpires(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	leader := createPod(t, ns, "leader", "web")
	lock := createLock(t, ns, "leader", "web")
	key := lockKey(lock)
	var token string
	eventually(t, "the leader to be marked", func() bool {
		token = getPod(t, leader).Annotations[locksv1.TokenAnnotationPrefix+"leader"]
		return holds(t, key, leader) && token != ""
	})
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	// 24 h later: the counter has expired; the lock is still held.
	if err := rdb.Del(context.Background(), "redisson_lock_token:{"+key+"}").Err(); err != nil {
		t.Fatal(err)
	}
	labelPod(t, leader, "touched", "1") // any event of the key
	settle()
	got := getPod(t, leader).Annotations[locksv1.TokenAnnotationPrefix+"leader"]
	st := getLock(t, lock).Status
	if got != token || st.Holder == nil || strconv.FormatInt(st.Holder.Token, 10) != token {
		t.Fatalf("the holder's token went from %s to %q on the pod and %+v in the status, though the ownership did not change", token, got, st.Holder)
	}
}

// Marks are trusted as a grant for any namespace that may use the key, and
// a tenant writes its own pods' annotations. On a key shared by nsA and
// nsB, nsA forges the marks of a grant on an old pod of its own that no
// lock would ever grant. After Redis loses the key while the manager
// restarts (a failover), the forged pod, being older, is "re-acquired" and
// ungated, and nsB's running grantee loses the key.
func TestReviewForgedMarksTakeAnotherNamespacesGrant(t *testing.T) {
	nsA, nsB := newNamespace(t), newNamespace(t)
	key := "shared-" + nsA
	first := startManager(t, sharing(key, nsA, nsB))
	// p is gated by a lock that does not select it: it is never granted.
	p := createPod(t, nsA, "p", "nobody", gatedBy("a"))
	time.Sleep(1100 * time.Millisecond)
	createLock(t, nsA, "a", "x", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	x := createPod(t, nsB, "x", "y", gatedBy("b"))
	createLock(t, nsB, "b", "y", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "x to be granted and ungated", func() bool { return holds(t, key, x) && !gatedWith(getPod(t, x), gateFor("b")) })
	bind(t, x)
	setContainers(t, x, corev1.PodRunning, running)
	first.stop()

	// The tenant of nsA annotates its own pod.
	forged := []byte(`{"metadata":{"annotations":{"owner.lockwarden.dev/a":"` + string(getPod(t, p).UID) + `:0","since.lockwarden.dev/a":"` +
		time.Now().UTC().Format(time.RFC3339) + `"}}}`)
	if err := k8s.Patch(context.Background(), getPod(t, p), client.RawPatch(types.MergePatchType, forged)); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	if err := rdb.Del(context.Background(), key).Err(); err != nil { // Redis lost it
		t.Fatal(err)
	}
	startManager(t, sharing(key, nsA, nsB))
	eventually(t, "the key to be held again", func() bool { return inspect(t, key).Held() })
	settle()
	if holds(t, key, p) || !gatedWith(getPod(t, p), gateFor("a")) {
		t.Fatalf("nsA's forged pod p took the key (%v) or was ungated (%v) while nsB's x runs",
			holds(t, key, p), !gatedWith(getPod(t, p), gateFor("a")))
	}
}

// A lock of another namespace naming a key it may not use is "revoked" and
// settled with the key: the key's reconcile adds its finalizer and writes
// the key's fencing token into its status, which its tenant reads. Each
// new grant's token is the Redis clock, so the tenant learns when the
// other namespace's key changes hands.
func TestReviewRefusedLockOfAnotherNamespaceReadsTheKeysToken(t *testing.T) {
	startManager(t)
	victim, tenant := newNamespace(t), newNamespace(t)
	createPod(t, victim, "leader", "web")
	lock := createLock(t, victim, "leader", "web")
	key := lockKey(lock)
	eventually(t, "the victim's lock to be held", func() bool { return inspect(t, key).Held() })
	spy := createLock(t, tenant, "spy", "nothing", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "the spy lock to be refused", func() bool { return getLock(t, spy).Status.Key == key })
	settle()
	if got, want := getLock(t, spy).Status.HighestToken, inspect(t, key).Token; got == want && got != 0 {
		t.Fatalf("namespace %s's refused lock shows %s's fencing token %d", tenant, victim, got)
	}
}

// A grant keeps the lease terms of the lock that made it only while the
// pod still carries that lock's gate: once lifted, a manager restart (or a
// re-take after Redis lost the key) picks the first lock of the namespace
// that selects the pod, which may have a far shorter lease.
func TestReviewAGrantLosesItsLocksLeaseOnceUngated(t *testing.T) {
	first := startManager(t)
	ns := newNamespace(t)
	key := sharedKey(ns, "k")
	createLock(t, ns, "a-short", "job", func(l *locksv1.DistributedLock) {
		l.Spec.Key, l.Spec.LeaseDuration = key, &metav1.Duration{Duration: time.Second}
	})
	pod := createPod(t, ns, "run", "job", gatedBy("b-long"), withLabels(map[string]string{"app": "job", "role": "run"}))
	createLock(t, ns, "b-long", "", func(l *locksv1.DistributedLock) {
		l.Spec.Key, l.Spec.LeaseDuration = key, &metav1.Duration{Duration: 30 * time.Second}
		l.Spec.Candidates = &locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"role": "run"}}
	})
	eventually(t, "the pod to be granted and ungated", func() bool { return holds(t, key, pod) && !gatedWith(getPod(t, pod), gateFor("b-long")) })
	first.stop()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	if err := rdb.Del(context.Background(), key).Err(); err != nil { // Redis lost it
		t.Fatal(err)
	}
	startManager(t)
	eventually(t, "the key to be taken again for the pod", func() bool { return holds(t, key, pod) })
	time.Sleep(200 * time.Millisecond)
	ttl, err := rdb.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 5*time.Second {
		t.Fatalf("the grant made through b-long (30 s) is held with a lease of %v: a-short's", ttl)
	}
}

// A lock whose key holds data that is not a lock is not Ready (KeyInUse)
// and tells the user to choose another key; spec.key is immutable, so the
// user deletes the lock. runPhases returns before finalizeDeleted when the
// key is not a lock, so the finalizer is never removed (b876e2d removed it).
func TestReviewDeletingAKeyInUseLockIsStrandedForever(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	key := sharedKey(ns, "in-use")
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	if err := rdb.Set(context.Background(), key, "someone else's data", 0).Err(); err != nil {
		t.Fatal(err)
	}
	lock := createLock(t, ns, "l", "web", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "the lock to be KeyInUse", func() bool {
		for _, c := range getLock(t, lock).Status.Conditions {
			if c.Reason == "KeyInUse" {
				return true
			}
		}
		return false
	})
	deleteLock(t, lock)
	deadline := time.Now().Add(10 * time.Second)
	for !lockGone(t, lock) {
		if time.Now().After(deadline) {
			t.Fatalf("the KeyInUse lock is still Terminating with finalizers %v", getLock(t, lock).Finalizers)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A record above the tokens Redis now hands out (Redis restarted empty on
// a host whose clock is behind the one that issued the recorded token)
// makes every lift of a fresh grant fail at admission, for ever: a grant
// keeps its token while it is held. The pod holds the key and stays gated,
// every other candidate waits, and the lock's status says nothing.
func TestReviewATokenBelowTheRecordStrandsTheGrantee(t *testing.T) {
	waitForFencing(t)
	startManager(t)
	ns := newNamespace(t)
	lock := createLock(t, ns, "singleton", "job")
	key := lockKey(lock)
	eventually(t, "the lock to be reconciled", func() bool { return getLock(t, lock).Status.Key == key })
	// The record of a grant made by a Redis whose clock was 10 s ahead.
	ahead := time.Now().Add(10 * time.Second).UnixMicro()
	if err := updateLockStatus(t, lock, func(l *locksv1.DistributedLock) { l.Status.HighestToken = ahead }); err != nil {
		t.Fatal(err)
	}
	first := createPod(t, ns, "first", "job", gatedBy("singleton"))
	createPod(t, ns, "second", "job", gatedBy("singleton"))
	eventually(t, "first to be granted", func() bool { return holds(t, key, first) })
	time.Sleep(time.Until(time.UnixMicro(ahead))) // past the recorded token's time: the clock has caught up
	// The grant is tried again every second: 5 s leave a loaded machine room.
	deadline := time.Now().Add(5 * time.Second)
	for gatedWith(getPod(t, first), gateFor("singleton")) {
		if time.Now().After(deadline) {
			t.Fatalf("first holds %s (token %d) but its lift is refused: still gated 5 s after the clock caught up; lock status: %+v", key, inspect(t, key).Token, getLock(t, lock).Status.Conditions)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// granted() and waitsFor() tell a lock's own marks from an older lock's by
// comparing the since-mark, written from the MANAGER's clock truncated to
// the second, with the lock's creationTimestamp, from the API server's. A
// manager a fraction of a second behind the API server that grants in the
// second the lock was created writes a since-mark "before" the lock. Here
// the mark is set as such a manager writes it. Renaming the lock then
// releases the running grant, and the new lock ungates its own candidate.
func TestReviewManagerClockBehindTheAPIServerLosesARunningGrant(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	run := createPod(t, ns, "run", "job", gatedBy("first"))
	first := createLock(t, ns, "first", "job")
	key := lockKey(first)
	eventually(t, "run to be granted and ungated", func() bool { return holds(t, key, run) && !gatedWith(getPod(t, run), gateFor("first")) })
	bind(t, run)
	setContainers(t, run, corev1.PodRunning, running)
	// As written by a manager whose clock is 0.3 s behind, in the second
	// the lock was created.
	skewed := getLock(t, first).CreationTimestamp.Add(-300 * time.Millisecond).UTC().Format(time.RFC3339)
	patch := []byte(`{"metadata":{"annotations":{"since.lockwarden.dev/first":"` + skewed + `"}}}`)
	if err := k8s.Patch(context.Background(), getPod(t, run), client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}

	deleteLock(t, first) // a rename: the new lock names the same key
	createLock(t, ns, "first-v2", "other", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	other := createPod(t, ns, "other", "other", gatedBy("first-v2"))
	settle()
	settle()
	if !holds(t, key, run) || !gatedWith(getPod(t, other), gateFor("first-v2")) || lockGone(t, first) {
		t.Fatalf("the old lock went (%v) and released run's grant (run holds: %v) while run runs; other ungated: %v",
			lockGone(t, first), holds(t, key, run), !gatedWith(getPod(t, other), gateFor("first-v2")))
	}
}

// Every free key of a lock in mode Observe is reconciled twice a second
// (observePoll), forever: each time a Redis script call and the cache
// reads of the key's scope. The README caps the controller's Redis load
// from renewals at once a second per lock "so thousands of locks cannot
// make renewals Redis's whole load"; 1,000 idle Observe locks (runs between
// CronJob schedules) cost 2,000 reconciles a second, through the same 4
// workers that release and grant every other key.
func TestReviewIdleObserveLocksPollRedisTwiceASecond(t *testing.T) {
	srv := redistest.Start(t)
	startManagerOn(t, managerConfig{redisAddr: srv.Addr})
	ns := newNamespace(t)
	const n = 100
	for i := 0; i < n; i++ {
		createLock(t, ns, "idle-"+strconv.Itoa(i), "nobody", func(l *locksv1.DistributedLock) { l.Spec.Mode = locksv1.ModeObserve })
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	// The rate is measured once every lock shows a status of its
	// generation: creating 100 locks costs a few reconciles each, which a
	// loaded machine spreads over many seconds.
	reconciled := func() bool {
		var locks locksv1.DistributedLockList
		if err := k8s.List(context.Background(), &locks, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		done := 0
		for _, l := range locks.Items {
			ready := meta.FindStatusCondition(l.Status.Conditions, locksv1.ConditionReady)
			if l.Status.ObservedGeneration == l.Generation && ready != nil && ready.ObservedGeneration == l.Generation {
				done++
			}
		}
		return done == n
	}
	for deadline := time.Now().Add(2 * time.Minute); !reconciled(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the %d locks were not all reconciled within 2 minutes", n)
		}
	}
	time.Sleep(time.Second) // the reconciles their own status writes caused
	calls := func() int64 {
		stats, err := rdb.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, line := range strings.Split(stats, "\n") {
			if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
				f := strings.SplitN(strings.TrimPrefix(line[strings.Index(line, ":")+1:], "calls="), ",", 2)
				v, _ := strconv.ParseInt(f[0], 10, 64)
				total += v
			}
		}
		return total
	}
	before := calls()
	time.Sleep(5 * time.Second)
	rate := float64(calls()-before) / 5
	t.Logf("%d idle Observe locks: %.0f Redis script calls a second", n, rate)
	if rate > n {
		t.Fatalf("%d idle Observe locks cost %.0f Redis script calls a second (more than the once a second per lock renewals are capped at)", n, rate)
	}
}

// Deleting a lock keeps the grant of a pod whose gate it lifted (waitsFor),
// but another lock of the namespace on the same key, being deleted too
// (kubectl delete dlock --all, which the README recommends before an
// uninstall; a namespace's deletion), releases that pod's hold in Redis:
// releaseGrantsOf counts only live locks as claiming it. The key is free
// while the pod runs, until the next reconcile takes it again with a new
// token; anyone else (an in-pod client, another cluster) may take it first.
func TestReviewAnotherDeletingLockReleasesAWaitedForGrant(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	key := sharedKey(ns, "k")
	run := createPod(t, ns, "run", "job", gatedBy("gating"))
	gating := createLock(t, ns, "gating", "job", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	also := createLock(t, ns, "also", "job", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "run to be granted and ungated", func() bool { return holds(t, key, run) && !gatedWith(getPod(t, run), gateFor("gating")) })
	bind(t, run)
	setContainers(t, run, corev1.PodRunning, running)
	token := inspect(t, key).Token

	deleteLock(t, gating)
	eventually(t, "the gating lock to wait for run", func() bool {
		for _, c := range getLock(t, gating).Status.Conditions {
			if c.Reason == "WaitingForHolder" {
				return true
			}
		}
		return false
	})
	// An outsider waits for the key, as an in-pod client or another
	// cluster would.
	taken := make(chan struct{})
	go func() {
		m, err := lockClient(t, "outsider").NewMutex(key, nil)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := m.Lock(ctx); err == nil {
			close(taken)
		}
	}()
	deleteLock(t, also)
	select {
	case <-taken:
		t.Fatalf("deleting lock %q released run's grant while run runs and lock %q waits for it: an outsider took %s", also.Name, gating.Name, key)
	case <-time.After(5 * time.Second):
	}
	if info := inspect(t, key); !holds(t, key, run) || info.Token != token {
		t.Fatalf("run's grant was released and taken again (token %d, was %d)", info.Token, token)
	}
}
