package controllers_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/redistest"
)

// Review 2, finding 1: a conflict (Redis lost the grant, and somebody else
// took the key before the controller took it back) erases the grant's
// record from the lock's status: computeStatuses writes status.holder from
// Redis's holder, nil for an owner outside the namespace. The sticky grant
// then lives only in the leader's memory; a new leader (restart, failover)
// does not know it, and once the other owner lets go it ungates the next
// guarded pod while the first one, ungated, has not stopped.
func TestReview2ConflictErasesTheGrantRecord(t *testing.T) {
	ns := newNamespace(t)
	a := startManagerOn(t, managerConfig{redisAddr: redisAddr, namespaces: []string{ns}})
	run1 := createPod(t, ns, "run-1", "job", gatedBy("singleton"))
	run2 := createPod(t, ns, "run-2", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job")
	key := lockKey(lock)
	eventually(t, "run-1 to be ungated", func() bool { return !gatedWith(getPod(t, run1), gateFor("singleton")) })
	eventually(t, "run-1's grant to be recorded", func() bool {
		g := getLock(t, lock).Status.Grant
		return g != nil && g.PodName == "run-1" && g.GateLifted
	})
	// run-1 is scheduled and pulls its image: Pending, ungated, not stopped.
	bind(t, run1)

	// The leader goes (a rolling update); meanwhile Redis loses run-1's
	// hold and an outsider (another cluster, a Redisson app) takes the key.
	a.stop()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	takeAsOutsider(t, rdb, key)

	startManagerOn(t, managerConfig{redisAddr: redisAddr, namespaces: []string{ns}})
	eventually(t, "a Conflict condition", func() bool {
		return meta.IsStatusConditionTrue(getLock(t, lock).Status.Conditions, locksv1.ConditionConflict)
	})
	eventually(t, "the conflict to show no holder of this namespace", func() bool { return getLock(t, lock).Status.Holder == nil })
	if g := getLock(t, lock).Status.Grant; g == nil || g.PodName != "run-1" || !g.GateLifted {
		t.Fatalf("the conflict erased run-1's grant record: %+v", g)
	}
	t.Logf("status after the conflict: holder=%v conditions=%v", getLock(t, lock).Status.Holder, conditionText(getLock(t, lock)))

	// The outsider lets go.
	if _, err := lockClient(t, "operator").ForceReleaseClient(context.Background(), key, "outsider"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the key to be held again", func() bool { return len(inspect(t, key).Holders) > 0 })
	settle()
	if p1, p2 := getPod(t, run1), getPod(t, run2); !gatedWith(p2, gateFor("singleton")) && !gatedWith(p1, gateFor("singleton")) {
		t.Fatalf("run-2 was ungated while run-1, ungated by an earlier grant, has not stopped (phase %q, node %q): two guarded pods of %s", p1.Status.Phase, p1.Spec.NodeName, key)
	}
}

// Finding 1, without any restart: the grantee's own in-pod client (say
// `lockwarden run` on the same key) takes the key after Redis lost the
// controller's hold. keepGrants forgets the grant in memory (heldItself),
// computeStatuses overwrites the record with the in-pod hold
// (grantedByController false, gateLifted false), and once that hold ends
// the next guarded pod is ungated beside the first.
func TestReview2GranteesOwnClientErasesTheGrant(t *testing.T) {
	ns := newNamespace(t)
	startManagerOn(t, managerConfig{redisAddr: redisAddr, namespaces: []string{ns}})
	run1 := createPod(t, ns, "run-1", "job", gatedBy("singleton"))
	run2 := createPod(t, ns, "run-2", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job")
	key := lockKey(lock)
	eventually(t, "run-1's grant to be recorded and its gate lifted", func() bool {
		g := getLock(t, lock).Status.Grant
		return g != nil && g.PodName == "run-1" && g.GateLifted && !gatedWith(getPod(t, run1), gateFor("singleton"))
	})
	bind(t, run1)

	// Redis loses the controller's hold, and run-1's own client takes the
	// key first, for ten seconds: time for a loaded machine's controller to
	// find it at its next renewal and record it before it lapses.
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	if _, err := rdb.TxPipelined(context.Background(), func(p redis.Pipeliner) error {
		p.Del(context.Background(), key)
		p.HSet(context.Background(), key, string(run1.UID)+":1", 1)
		p.PExpire(context.Background(), key, 10*time.Second)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the record to become an in-pod hold", func() bool {
		h := getLock(t, lock).Status.Holder
		return h != nil && !h.GrantedByController
	})
	t.Logf("record: %+v", getLock(t, lock).Status.Holder)
	eventually(t, "the in-pod hold to lapse and the key to be held again", func() bool {
		info := inspect(t, key)
		return len(info.Holders) == 1 && strings.HasSuffix(string(info.Holders[0].Owner), ":0")
	})
	settle()
	if p1, p2 := getPod(t, run1), getPod(t, run2); !gatedWith(p2, gateFor("singleton")) && !gatedWith(p1, gateFor("singleton")) {
		t.Fatalf("run-2 was ungated while run-1, ungated by an earlier grant, has not stopped (phase %q)", p1.Status.Phase)
	}
}

// Finding 1, second consequence, with one manager and no restart: after a
// conflict the controller takes the key back for the same pod, but
// holderStatus only carries gateLifted over from a record of the same pod
// granted by the controller, and the conflict erased that record. The new
// record says gateLifted=false, so renaming the lock (a new lock on the
// key, the old one deleted) releases the running grant at once and the new
// lock ungates its own pod beside it.
func TestReview2ConflictLosesGateLiftedAndARenameReleasesTheRun(t *testing.T) {
	ns := newNamespace(t)
	startManagerOn(t, managerConfig{redisAddr: redisAddr, namespaces: []string{ns}})
	key := ns + "/jobs"
	run1 := createPod(t, ns, "run-1", "job", gatedBy("jobs"))
	old := createLock(t, ns, "jobs", "job", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "run-1's grant to be recorded and its gate lifted", func() bool {
		g := getLock(t, old).Status.Grant
		return g != nil && g.PodName == "run-1" && g.GateLifted && !gatedWith(getPod(t, run1), gateFor("jobs"))
	})
	bind(t, run1)
	setContainers(t, run1, corev1.PodRunning, running)

	// Redis loses the hold and an outsider takes the key for a moment.
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	takeAsOutsider(t, rdb, key)
	eventually(t, "the conflict to show no holder of this namespace", func() bool { return getLock(t, old).Status.Holder == nil })
	if _, err := lockClient(t, "operator").ForceReleaseClient(context.Background(), key, "outsider"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "run-1 to hold the key again", func() bool {
		h := getLock(t, old).Status.Holder
		return holds(t, key, run1) && h != nil && h.PodName == "run-1"
	})
	t.Logf("record after the conflict: %+v", getLock(t, old).Status.Grant)

	// The lock is deleted and created again (issue 20, case 11): the old
	// one must wait for run-1, whose gate it lifted.
	deleteLock(t, old)
	settle()
	if !lockGone(t, old) {
		return // the old lock waits for run-1, as it should
	}
	t.Logf("the old lock went while run-1 runs; key: %+v", inspect(t, key))
	createLock(t, ns, "jobs-v2", "other", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	run2 := createPod(t, ns, "run-2", "other", gatedBy("jobs-v2"))
	settle()
	settle()
	if p1 := getPod(t, run1); !gatedWith(getPod(t, run2), gateFor("jobs-v2")) {
		t.Fatalf("run-2 was ungated while run-1 (phase %s), ungated by the old lock, runs", p1.Status.Phase)
	}
}

// Finding 2: a lock's status is written with an unconditional merge patch
// (patchStatus: client.MergeFrom, no resourceVersion), so a manager paused
// after it read the key writes a stale status when it wakes: here
// "holder: null" over the record of the grant another manager made and
// lifted meanwhile. The record comes back from Redis without gateLifted,
// and deleting and re-creating the lock (issue 20, case 11) then releases
// the running grant and ungates another pod beside it.
func TestReview2PausedManagerErasesAnotherManagersGrantRecord(t *testing.T) {
	ns := newNamespace(t)
	key := ns + "/jobs"
	var armed atomic.Bool
	paused, wake, woke := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	a := startManagerOn(t, managerConfig{redisAddr: redisAddr, namespaces: []string{ns},
		intercept: func(obj client.Object, sub string) func(error) {
			if _, ok := obj.(*locksv1.DistributedLock); !ok || sub != "status" || !armed.CompareAndSwap(true, false) {
				return nil
			}
			close(paused)
			<-wake
			return func(err error) { woke <- err }
		}})
	w := createPod(t, ns, "w", "job", gatedBy("jobs"))
	lock := createLock(t, ns, "jobs", "job", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "w to be granted and ungated", func() bool {
		g := getLock(t, lock).Status.Grant
		return g != nil && g.PodName == "w" && g.GateLifted && !gatedWith(getPod(t, w), gateFor("jobs"))
	})
	bind(t, w)
	setContainers(t, w, corev1.PodRunning, running)
	settle()

	// w ends. A releases it, finds nobody to grant, and is paused just
	// before it writes the status it computed (holder: none).
	armed.Store(true)
	setContainers(t, w, corev1.PodSucceeded, exited(0))
	select {
	case <-paused:
	case <-time.After(20 * time.Second):
		t.Fatal("manager A never wrote the status")
	}
	// Meanwhile another manager (the new leader) grants x, which runs.
	x := createPod(t, ns, "x", "job", gatedBy("jobs"))
	startManagerOn(t, managerConfig{redisAddr: redisAddr, namespaces: []string{ns}})
	eventually(t, "B to grant x and lift its gate", func() bool {
		g := getLock(t, lock).Status.Grant
		return g != nil && g.PodName == "x" && g.GateLifted && !gatedWith(getPod(t, x), gateFor("jobs"))
	})
	bind(t, x)
	setContainers(t, x, corev1.PodRunning, running)

	close(wake) // A wakes, writes, and is gone (it lost its leadership)
	t.Logf("A's stale status write: %v", <-woke)
	a.stop()
	t.Logf("after A's stale write: holder %+v", getLock(t, lock).Status.Holder)
	eventually(t, "B to record x again", func() bool {
		h := getLock(t, lock).Status.Holder
		return h != nil && h.PodName == "x"
	})
	t.Logf("B's record: %+v", getLock(t, lock).Status.Grant)

	deleteLock(t, lock)
	settle()
	if !lockGone(t, lock) {
		return // the lock waits for x, as it should
	}
	createLock(t, ns, "jobs-v2", "other", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	run2 := createPod(t, ns, "run-2", "other", gatedBy("jobs-v2"))
	settle()
	settle()
	if !gatedWith(getPod(t, run2), gateFor("jobs-v2")) {
		t.Fatalf("run-2 was ungated while x (phase %s), ungated by the deleted lock, runs", getPod(t, x).Status.Phase)
	}
}

// Finding 3: the fence has a hole where a lock was deleted. Manager A takes
// the key for z and is paused just before it records the grant. During the
// pause its hold lapses, the lock is renamed (deleted, a new lock on the
// same key), and manager B finalizes the old lock (no record: nothing to
// wait for) and grants the key to x through the new lock, which runs. A
// wakes: its record of the deleted lock is NotFound, which recordGrant
// skips; its check past the cache (done before the pause) only read the
// locks of its stale scope; and the fencing policy compares a lift of gate
// G only with the lock named G, which is gone. A lifts z's gate.
func TestReview2PausedManagerLiftsTheGateOfADeletedLock(t *testing.T) {
	waitForFencing(t)
	srv := redistest.Start(t)
	cut := redistest.StartProxy(t, srv.Addr)
	ns := newNamespace(t)
	key := ns + "/jobs"
	var armed atomic.Bool
	armed.Store(true)
	paused, wake, woke := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	a := startManagerOn(t, managerConfig{redisAddr: cut.Addr, namespaces: []string{ns},
		intercept: func(obj client.Object, sub string) func(error) {
			if _, ok := obj.(*locksv1.DistributedLock); !ok || sub != "status" || !armed.CompareAndSwap(true, false) {
				return nil
			}
			cut.Cut()
			close(paused)
			<-wake
			return func(err error) { woke <- err }
		}})
	z := createPod(t, ns, "z", "job", gatedBy("jobs"))
	old := createLock(t, ns, "jobs", "job", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	select {
	case <-paused:
	case <-time.After(20 * time.Second):
		t.Fatal("manager A never came to its record")
	}
	// During the pause: A's hold lapses; the lock is renamed.
	eventually(t, "A's hold of z to lapse", func() bool { return !holdsOn(t, srv, key, z) })
	deleteLock(t, old)
	createLock(t, ns, "jobs-v2", "other", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	x := createPod(t, ns, "x", "other", gatedBy("jobs-v2"))
	startManagerOn(t, managerConfig{redisAddr: srv.Addr, namespaces: []string{ns}})
	eventually(t, "B to let the old lock go and grant x", func() bool {
		return lockGone(t, old) && !gatedWith(getPod(t, x), gateFor("jobs-v2"))
	})
	bind(t, x)
	setContainers(t, x, corev1.PodRunning, running)

	close(wake)
	t.Logf("A's record of the deleted lock: %v", <-woke)
	settle()
	a.stop()
	if !gatedWith(getPod(t, z), gateFor("jobs")) && !gatedWith(getPod(t, x), gateFor("jobs-v2")) {
		p := getPod(t, z)
		t.Fatalf("A ungated z (token %s) while x, granted the key by B, runs (jobs-v2's highestToken %d)",
			p.Annotations[locksv1.TokenAnnotationPrefix+"jobs"], getLock(t, &locksv1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "jobs-v2"}}).Status.HighestToken)
	}
}

// Finding 6: for a guarded pod, a record above Redis's tokens is caught by
// confirmNoOtherGrant ("records fencing token ... above this grant's"),
// which fails the reconcile, before the status patch whose Invalid answer
// sets FencingTokenBehind: the condition the README promises never shows,
// the retries follow the error backoff, and every attempt tells the pod
// it was Granted (and the lock Acquired), though the grant is given back.
func TestReview2TokenBehindIsNeverShownForAGuardedPod(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	lock := createLock(t, ns, "singleton", "job")
	eventually(t, "the lock to be reconciled", func() bool { return getLock(t, lock).Status.Key == lockKey(lock) })
	// A minute ahead: Redis's tokens (microseconds of its clock) do not
	// catch up while the test runs, however loaded the machine.
	ahead := time.Now().Add(time.Minute).UnixMicro()
	if err := updateLockStatus(t, lock, func(l *locksv1.DistributedLock) { l.Status.HighestToken = ahead }); err != nil {
		t.Fatal(err)
	}
	first := createPod(t, ns, "first", "job", gatedBy("singleton"))
	eventually(t, "Ready=False FencingTokenBehind", func() bool {
		c := meta.FindStatusCondition(getLock(t, lock).Status.Conditions, locksv1.ConditionReady)
		return c != nil && c.Reason == "FencingTokenBehind"
	})
	time.Sleep(3 * time.Second) // retries, had there been any, tell the pod again
	c := meta.FindStatusCondition(getLock(t, lock).Status.Conditions, locksv1.ConditionReady)
	var events corev1.EventList
	if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	granted := int32(0)
	for _, e := range events.Items {
		if e.InvolvedObject.Name == "first" && e.Reason == "Granted" {
			granted += e.Count
		}
	}
	t.Logf("Ready: %+v; Granted Events on first: %d; gated: %v", c, granted, gatedWith(getPod(t, first), gateFor("singleton")))
	if c == nil || c.Reason != "FencingTokenBehind" || granted > 1 {
		t.Fatalf("want Ready=False FencingTokenBehind and no repeated Granted Events; got %+v and %d Granted Events", c, granted)
	}
}

// Review 3: a leader P granted through lock a (no gate, so its record has
// GateLifted=false). While the manager is down, lock b on the same key,
// which selects P too, is created, a is deleted, and the hold's lease runs
// out. The README says a grant Redis lost is found from the statuses, and
// deleting a lock leaves the grant of a pod another lock of the namespace
// still claims: the Terminating lock's record must still name P (ignoring
// every such record granted the key to Q).
func TestADeletingLocksRecordKeepsAGrantALiveLockClaims(t *testing.T) {
	first := startManager(t)
	ns := newNamespace(t)
	key := ns + "/shared"
	q := createPod(t, ns, "q", "web", withLabels(map[string]string{"app": "web", "all": "yes"}))
	time.Sleep(1100 * time.Millisecond) // creation timestamps have second resolution
	p := createPod(t, ns, "p", "leader", withLabels(map[string]string{"app": "leader", "all": "yes"}))
	a := createLock(t, ns, "a", "leader", func(l *locksv1.DistributedLock) {
		l.Spec.Key = key
		l.Spec.LeaseDuration = &metav1.Duration{Duration: time.Second}
	})
	eventually(t, "p to hold", func() bool {
		g := getLock(t, a).Status.Grant
		return holderOf(t, a) == "p" && g != nil && g.PodUID == string(p.UID)
	})
	first.stop()

	createLock(t, ns, "b", "x", func(l *locksv1.DistributedLock) {
		l.Spec.Key = key
		l.Spec.LeaseDuration = &metav1.Duration{Duration: time.Second}
		l.Spec.Candidates = &locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"all": "yes"}}
	})
	if err := k8s.Delete(context.Background(), getLock(t, a)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lease to run out", func() bool { return !inspect(t, key).Held() })

	startManager(t)
	eventually(t, "somebody to hold the key", func() bool { return inspect(t, key).Held() })
	time.Sleep(2 * time.Second)
	info := inspect(t, key)
	t.Logf("holder: %+v (p %s, q %s)", info.Holders, p.UID, q.UID)
	if string(info.Holders[0].Owner) != string(p.UID)+":0" {
		t.Fatalf("P's grant, which live lock b claims, was dropped: %s holds (q is %s)", info.Holders[0].Owner, q.UID)
	}
}

// Review 4: a lock's leaseDuration edited while its grant is held, then a
// manager restart. The library refuses to re-enter the kept hold under the
// new terms (it would cut another holder's lease), so the new manager could
// not adopt it, and failed every reconcile of the key until the old lease
// ran out. It takes the key again for the same pod under the new terms.
func TestALeaseEditedAcrossARestartIsTakenAgainForTheSamePod(t *testing.T) {
	first := startManager(t)
	ns := newNamespace(t)
	a := createPod(t, ns, "a", "web")
	createPod(t, ns, "b", "web")
	lock := createLock(t, ns, "leader", "web", func(l *locksv1.DistributedLock) {
		l.Spec.LeaseDuration = &metav1.Duration{Duration: time.Minute}
	})
	eventually(t, "pod a to hold the lock", func() bool { return holderOf(t, lock) == "a" })
	before := getLock(t, lock).Status.Grant.Token
	first.stop()
	updateLock(t, lock, func(l *locksv1.DistributedLock) {
		l.Spec.LeaseDuration = &metav1.Duration{Duration: 2 * time.Second}
	})

	startManager(t)
	// Well within the minute the kept hold has left.
	eventually(t, "pod a to hold the key under the new lease", func() bool {
		info := inspect(t, ns+"/leader")
		return len(info.Holders) == 1 && string(info.Holders[0].Owner) == string(a.UID)+":0" && info.TTL <= 2*time.Second
	})
	eventually(t, "the new token recorded", func() bool {
		g := getLock(t, lock).Status.Grant
		return g != nil && g.PodUID == string(a.UID) && g.Token > before
	})
	assertEvents(t, ns, "Reacquired")
}
