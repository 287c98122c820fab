package controllers_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// TestModel drives the real reconciler, against envtest and a real
// redis-server, through random sequences of pod events (create, schedule
// and run, succeed, fail, delete with grace, containers stopping, node
// loss), lost leases, Redis restarts without persistence, manager restarts,
// selector changes and key changes, on three locks in two namespaces that
// share pods and a key. After every step it settles the locks by calling
// Reconcile until a pass writes nothing, and a checker asserts, from the
// pods' own status and from Redis:
//   - at most one guarded pod per key is ungated and not yet stopped;
//   - a gate is only ever lifted from a pod holding the lock's key;
//   - every mark agrees with Redis, and the holder carries the marks of the
//     locks that select it;
//   - no holder in Redis is a pod that has stopped or is gone.
//
// LOCKWARDEN_MODEL_STEPS sets the number of steps (default 10,000, shared
// between two independent worlds that run in parallel), and
// LOCKWARDEN_MODEL_SEED the seed (default: the time, logged).
func TestModel(t *testing.T) {
	steps := 10000
	if v := os.Getenv("LOCKWARDEN_MODEL_STEPS"); v != "" {
		var err error
		if steps, err = strconv.Atoi(v); err != nil {
			t.Fatal(err)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("LOCKWARDEN_MODEL_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	// The worlds run side by side, since a step mostly waits on the API
	// server; two, as go test runs GOMAXPROCS parallel tests at once and
	// this suite is meant to run on two cores.
	const worlds = 2
	for n := range worlds {
		t.Run(fmt.Sprintf("world-%d", n), func(t *testing.T) {
			t.Parallel()
			seed := seed + uint64(n)
			t.Logf("seed %d (LOCKWARDEN_MODEL_SEED=%d reproduces this world as world-0)", seed, seed)
			w := newWorld(t, seed)
			start := time.Now()
			mine := steps / worlds
			if n < steps%worlds {
				mine++
			}
			for i := range mine {
				what := w.step()
				w.settle(what)
				if i%100 == 0 {
					w.verifyCache()
				}
				w.check(i, what)
			}
			t.Logf("%d steps in %v: %v", mine, time.Since(start).Round(time.Millisecond), w.counts)
		})
	}
}

// world is the model: the cluster as the test plays kubelet, scheduler and
// administrator, and what the checker remembers between steps.
type world struct {
	t      *testing.T
	ctx    context.Context
	rng    *rand.Rand
	redis  *redistest.Server
	h      *harness
	nss    []string
	shared string
	locks  []*modelLock
	seq    int
	counts map[string]int
	// ungatedFor records, per pod and lock name, the key the lock had when
	// the pod's gate was lifted: the pod is then that key's guarded pod
	// until it stops.
	ungatedFor map[types.UID]map[string]string
	// gates are the lock gates each pod was created with.
	gates map[types.UID][]string
	// operator is a plain client that takes leases away in Redis.
	operator *redislock.Client
	// expect are the writes the manager's cache must show before the
	// model reads it.
	expect *expectations
	// podsNow and locksNow are the model's pods and locks, read when the
	// cache last caught up with every write.
	podsNow  []corev1.Pod
	locksNow []locksv1.DistributedLock
}

// modelLock is one DistributedLock of the model.
type modelLock struct {
	ns, name string
	keys     []string // the keys it may be recreated with; keys[0] first
	key      string
	groups   []string // it selects pods whose label group is one of these
	exists   bool
}

// released stands for the key of a lock that was deleted: its gate was
// lifted, but the lock's promise went with it.
const released = "(released)"

var modelGroups = [][]string{{"a"}, {"b"}, {"a", "b"}}

func newWorld(t *testing.T, seed uint64) *world {
	w := &world{
		t: t, ctx: context.Background(), rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		redis: redistest.Start(t), counts: map[string]int{},
		ungatedFor: map[types.UID]map[string]string{}, gates: map[types.UID][]string{},
		expect: newExpectations(),
	}
	w.nss = []string{newNamespace(t), newNamespace(t)}
	w.shared = "shared-" + w.nss[0]
	own, other := w.nss[0]+"/own", w.nss[0]+"/other"
	w.locks = []*modelLock{
		{ns: w.nss[0], name: "alpha", keys: []string{w.shared}, groups: []string{"a"}},
		{ns: w.nss[0], name: "beta", keys: []string{own, other}, groups: []string{"a", "b"}},
		{ns: w.nss[1], name: "gamma", keys: []string{w.shared}, groups: []string{"b"}},
	}
	w.startManager()
	w.operator = w.lockClient()
	for _, l := range w.locks {
		w.createLock(l, l.keys[0])
	}
	w.settle("setup")
	return w
}

func (w *world) startManager() {
	w.h = startManagerOn(w.t, managerConfig{redisAddr: w.redis.Addr, namespaces: w.nss, observe: w.expect.wrote}, sharing(w.shared, w.nss...))
}

func (w *world) lockClient() *redislock.Client {
	c, err := redislock.New(w.redis.Client(w.t), redislock.Options{ID: "operator", WatchdogLease: 5 * time.Second})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (w *world) createLock(l *modelLock, key string) {
	lock := &locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: l.ns, Name: l.name},
		Spec: locksv1.DistributedLockSpec{
			Key:           key,
			LeaseDuration: &metav1.Duration{Duration: 5 * time.Second},
			Candidates:    groupSelector(l.groups),
		},
	}
	if err := k8s.Create(w.ctx, lock); err != nil {
		w.t.Fatal(err)
	}
	w.expect.created(lock)
	l.key, l.exists = key, true
}

func groupSelector(groups []string) *locksv1.PodSelector {
	var values []locksv1.LabelValue
	for _, g := range groups {
		values = append(values, locksv1.LabelValue(g))
	}
	return &locksv1.PodSelector{MatchExpressions: []locksv1.LabelRequirement{{Key: "group", Operator: "In", Values: values}}}
}

// pods are the model's pods as the API server had them when the locks
// last settled, which nothing has changed since.
func (w *world) pods() []corev1.Pod { return w.podsNow }

func (w *world) pick(pods []corev1.Pod, ok func(*corev1.Pod) bool) *corev1.Pod {
	var matching []*corev1.Pod
	for i := range pods {
		if ok(&pods[i]) {
			matching = append(matching, &pods[i])
		}
	}
	if len(matching) == 0 {
		return nil
	}
	return matching[w.rng.IntN(len(matching))]
}

// step plays one random event and says what it was.
func (w *world) step() string {
	pods := w.pods()
	type event struct {
		weight int
		name   string
		run    func() bool
	}
	events := []event{
		{16, "create pod", func() bool { return w.createPod(pods) }},
		{14, "schedule and run", func() bool {
			p := w.pick(pods, func(p *corev1.Pod) bool {
				return len(p.Spec.SchedulingGates) == 0 && p.Spec.NodeName == "" && p.DeletionTimestamp.IsZero()
			})
			if p == nil {
				return false
			}
			w.bindAndRun(p)
			return true
		}},
		{8, "succeed", func() bool { return w.finish(pods, corev1.PodSucceeded) }},
		{6, "fail", func() bool { return w.finish(pods, corev1.PodFailed) }},
		{10, "delete with grace", func() bool {
			// Mostly running pods on a node, whose deletion is graceful:
			// the path where a holder runs on after its deletion.
			running := w.rng.IntN(4) > 0
			p := w.pick(pods, func(p *corev1.Pod) bool {
				return p.DeletionTimestamp.IsZero() && (p.Spec.NodeName != "" && !isStopped(p)) == running
			})
			if p == nil {
				return false
			}
			w.must(client.IgnoreNotFound(k8s.Delete(w.ctx, p)))
			w.expect.deleted(p)
			return true
		}},
		{7, "containers stop after deletion", func() bool {
			p := w.pick(pods, func(p *corev1.Pod) bool { return !p.DeletionTimestamp.IsZero() && !isStopped(p) })
			if p == nil {
				return false
			}
			w.setContainers(p, p.Status.Phase, exited(0))
			return true
		}},
		{7, "kubelet removes a stopped pod", func() bool {
			p := w.pick(pods, func(p *corev1.Pod) bool { return !p.DeletionTimestamp.IsZero() && isStopped(p) })
			if p == nil {
				return false
			}
			w.forceDelete(p)
			return true
		}},
		{3, "node lost: a terminating pod is force-deleted", func() bool {
			p := w.pick(pods, func(p *corev1.Pod) bool { return !p.DeletionTimestamp.IsZero() && !isStopped(p) })
			if p == nil {
				return false
			}
			w.forceDelete(p)
			return true
		}},
		{4, "lease lost in Redis", func() bool {
			l := w.locks[w.rng.IntN(len(w.locks))]
			info, err := w.operator.Inspect(w.ctx, l.key)
			w.must(err)
			if !info.Held() {
				return false
			}
			owner := string(info.Holders[0].Owner)
			_, err = w.operator.ForceRelease(w.ctx, l.key, owner[:strings.LastIndexByte(owner, ':')])
			w.must(err)
			return true
		}},
		{1, "Redis restarts without persistence", func() bool {
			w.redis.Stop()
			w.must(w.redis.Restart())
			return true
		}},
		{1, "manager restarts", func() bool {
			if w.rng.IntN(4) != 0 { // rarer still: a restart costs a second
				return false
			}
			w.h.stop()
			w.startManager()
			return true
		}},
		{3, "selector changes", func() bool {
			l := w.locks[w.rng.IntN(len(w.locks))]
			if !l.exists {
				return false
			}
			l.groups = modelGroups[w.rng.IntN(len(modelGroups))]
			lock := &locksv1.DistributedLock{}
			w.must(k8s.Get(w.ctx, client.ObjectKey{Namespace: l.ns, Name: l.name}, lock))
			patch := client.MergeFrom(lock.DeepCopy())
			lock.Spec.Candidates = groupSelector(l.groups)
			w.must(k8s.Patch(w.ctx, lock, patch))
			w.expect.wrote(lock)
			return true
		}},
		{1, "lock deleted (to change its key)", func() bool {
			l := w.locks[1]
			if !l.exists {
				return false
			}
			lock := &locksv1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: l.ns, Name: l.name}}
			w.must(k8s.Delete(w.ctx, lock))
			w.expect.deleted(lock)
			return true
		}},
		{2, "lock recreated with another key", func() bool {
			l := w.locks[1]
			if l.exists {
				return false
			}
			w.createLock(l, l.keys[w.rng.IntN(len(l.keys))])
			return true
		}},
	}
	total := 0
	for _, e := range events {
		total += e.weight
	}
	for {
		n := w.rng.IntN(total)
		for _, e := range events {
			if n -= e.weight; n < 0 {
				if e.run() {
					w.counts[e.name]++
					return e.name
				}
				break
			}
		}
	}
}

// createPod creates a pod in a random namespace and group, behind the gates
// of a random subset of its namespace's locks, or none: then it is
// unguarded and runs at once.
func (w *world) createPod(pods []corev1.Pod) bool {
	ns := w.nss[w.rng.IntN(len(w.nss))]
	live := 0
	for i := range pods {
		if pods[i].Namespace == ns {
			live++
		}
	}
	if live >= 8 {
		return false
	}
	w.seq++
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p%d", w.seq), Labels: map[string]string{"group": []string{"a", "b"}[w.rng.IntN(2)]}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
	}
	var gates []string
	for _, l := range w.locks {
		if l.ns == ns && w.rng.IntN(3) > 0 {
			gates = append(gates, l.name)
			pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: gateFor(l.name)})
		}
	}
	w.must(k8s.Create(w.ctx, pod))
	w.expect.created(pod)
	w.gates[pod.UID] = gates
	if len(gates) == 0 {
		w.bindAndRun(pod)
	}
	return true
}

func (w *world) bindAndRun(p *corev1.Pod) {
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}, Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}
	if err := k8s.SubResource("binding").Create(w.ctx, p, binding); err != nil {
		w.t.Fatalf("bind %s: %v", p.Name, err)
	}
	w.setContainers(p, corev1.PodRunning, running)
}

func (w *world) finish(pods []corev1.Pod, phase corev1.PodPhase) bool {
	p := w.pick(pods, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if p == nil {
		return false
	}
	w.setContainers(p, phase, exited(0))
	return true
}

// setContainers sets the pod's phase and container state as a kubelet
// would, retrying when the controller's patch of the marks got in between.
func (w *world) setContainers(p *corev1.Pod, phase corev1.PodPhase, state corev1.ContainerState) {
	latest := &corev1.Pod{}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(w.ctx, client.ObjectKeyFromObject(p), latest); err != nil {
			return err
		}
		latest.Status.Phase = phase
		latest.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", Image: "busybox", State: state}}
		return k8s.Status().Update(w.ctx, latest)
	})
	if err != nil {
		w.must(client.IgnoreNotFound(err))
		return
	}
	w.expect.wrote(latest)
}

func (w *world) forceDelete(p *corev1.Pod) {
	w.must(client.IgnoreNotFound(k8s.Delete(w.ctx, p, client.GracePeriodSeconds(0))))
	w.expect.deleted(p)
}

func (w *world) must(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
}

// settle reconciles every lock until a pass changes nothing: no API write,
// no error, nothing to retry, and the cache has caught up with the API.
func (w *world) settle(after string) {
	w.t.Helper()
	for pass := 0; pass < 50; pass++ {
		w.waitForCache()
		before := w.h.writes.Load()
		quiet := true
		settled := map[string]bool{}
		for _, l := range w.locksNow {
			// One reconcile settles every lock naming a key, but for
			// its own finalizer.
			key := l.Spec.Key
			if key == "" {
				key = l.Namespace + "/" + l.Name
			}
			if settled[key] && l.DeletionTimestamp.IsZero() && slices.Contains(l.Finalizers, locksv1.Finalizer) {
				continue
			}
			settled[key] = true
			res, err := w.h.r.Reconcile(w.ctx, controllers.KeyRequest{Key: key})
			// A look asked for soon means a retry (Redis failed, a
			// conflict); a later one is a holder's start deadline.
			if err != nil || (res.RequeueAfter > 0 && res.RequeueAfter <= 2*time.Second) {
				quiet = false
			}
			// A lock being deleted is settled once it is gone: its
			// finalizer may have run in a worker since the cache was read.
			if !l.DeletionTimestamp.IsZero() {
				quiet = false
			}
		}
		if quiet && w.h.writes.Load() == before {
			w.syncLocks()
			return
		}
		if !quiet {
			time.Sleep(5 * time.Millisecond)
		}
	}
	w.t.Fatalf("the locks did not settle after %s", after)
}

// syncLocks records which locks exist, now that deleted ones are gone, and
// forgets the pods a deleted lock guarded: deleting a lock releases its
// grants, and with them its promise.
func (w *world) syncLocks() {
	for _, l := range w.locks {
		if !slices.ContainsFunc(w.locksNow, func(x locksv1.DistributedLock) bool { return x.Namespace == l.ns && x.Name == l.name }) {
			if l.exists {
				for _, byLock := range w.ungatedFor {
					if _, ok := byLock[l.name]; ok {
						byLock[l.name] = released
					}
				}
			}
			l.exists = false
		}
	}
}

// waitForCache waits until the manager's cache shows every write the test
// and the controller made, and reads the model's pods and locks from it.
func (w *world) waitForCache() {
	w.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !w.expect.met(w.ctx, w.h.cache) {
		if time.Now().After(deadline) {
			w.t.Fatal("the cache did not catch up")
		}
		time.Sleep(time.Millisecond)
	}
	var pods corev1.PodList
	var locks locksv1.DistributedLockList
	w.podsNow, w.locksNow = nil, nil
	for _, ns := range w.nss {
		w.must(w.h.cache.List(w.ctx, &pods, client.InNamespace(ns)))
		w.must(w.h.cache.List(w.ctx, &locks, client.InNamespace(ns)))
		w.podsNow = append(w.podsNow, pods.Items...)
		w.locksNow = append(w.locksNow, locks.Items...)
	}
}

// verifyCache checks that the cache, once the expectations are met, shows
// what the API server has: that the expectations miss no write. The
// controller's workers may still be writing, so it retries for a while.
func (w *world) verifyCache() {
	w.t.Helper()
	var api, cached string
	for range 100 {
		var pods []corev1.Pod
		var locks []locksv1.DistributedLock
		for _, ns := range w.nss {
			var p corev1.PodList
			var l locksv1.DistributedLockList
			w.must(k8s.List(w.ctx, &p, client.InNamespace(ns)))
			w.must(k8s.List(w.ctx, &l, client.InNamespace(ns)))
			pods, locks = append(pods, p.Items...), append(locks, l.Items...)
		}
		api = versions(&corev1.PodList{Items: pods}) + " " + versions(&locksv1.DistributedLockList{Items: locks})
		w.waitForCache()
		cached = versions(&corev1.PodList{Items: w.podsNow}) + " " + versions(&locksv1.DistributedLockList{Items: w.locksNow})
		if api == cached {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.t.Fatalf("the cache, with every expected write seen, differs from the API server:\ncache %s\napi   %s", cached, api)
}

// expectations are the writes the cache must show: a resourceVersion at
// least as new as the write's, or, after a delete, the object gone or
// terminating.
type expectations struct {
	mu      sync.Mutex
	minRV   map[expectKey]uint64
	present map[expectKey]bool // created by the test: must be in the cache
	gone    map[expectKey]bool
}

type expectKey struct {
	kind string
	key  client.ObjectKey
}

func newExpectations() *expectations {
	return &expectations{minRV: map[expectKey]uint64{}, present: map[expectKey]bool{}, gone: map[expectKey]bool{}}
}

func keyOf(obj client.Object) (expectKey, bool) {
	switch obj.(type) {
	case *corev1.Pod:
		return expectKey{"pod", client.ObjectKeyFromObject(obj)}, true
	case *locksv1.DistributedLock:
		return expectKey{"lock", client.ObjectKeyFromObject(obj)}, true
	}
	return expectKey{}, false
}

// wrote records a write whose result obj holds.
func (e *expectations) wrote(obj client.Object) {
	k, ok := keyOf(obj)
	rv, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
	if !ok || err != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.minRV[k] = max(e.minRV[k], rv)
}

func (e *expectations) created(obj client.Object) {
	e.wrote(obj)
	if k, ok := keyOf(obj); ok {
		e.mu.Lock()
		e.present[k] = true
		e.mu.Unlock()
	}
}

func (e *expectations) deleted(obj client.Object) {
	if k, ok := keyOf(obj); ok {
		e.mu.Lock()
		e.gone[k] = true
		delete(e.present, k)
		e.mu.Unlock()
	}
}

// met reports whether the cache shows every expected write, and forgets
// the ones it shows.
func (e *expectations) met(ctx context.Context, cache client.Reader) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	get := func(k expectKey) (client.Object, bool) {
		var obj client.Object = &corev1.Pod{}
		if k.kind == "lock" {
			obj = &locksv1.DistributedLock{}
		}
		err := cache.Get(ctx, k.key, obj)
		return obj, err == nil
	}
	for k, rv := range e.minRV {
		obj, found := get(k)
		if !found && e.present[k] {
			return false
		}
		if found {
			if got, _ := strconv.ParseUint(obj.GetResourceVersion(), 10, 64); got < rv {
				return false
			}
		}
		delete(e.minRV, k)
		delete(e.present, k)
	}
	for k := range e.gone {
		if obj, found := get(k); found && obj.GetDeletionTimestamp() == nil {
			return false
		}
		delete(e.gone, k)
	}
	return true
}

func versions(list client.ObjectList) string {
	var out []string
	switch l := list.(type) {
	case *corev1.PodList:
		for _, p := range l.Items {
			out = append(out, p.Namespace+"/"+p.Name+"@"+p.ResourceVersion)
		}
	case *locksv1.DistributedLockList:
		for _, x := range l.Items {
			out = append(out, x.Namespace+"/"+x.Name+"@"+x.ResourceVersion)
		}
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

func isStopped(p *corev1.Pod) bool {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return true
	}
	if len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Terminated == nil {
			return false
		}
	}
	return true
}

// check asserts the invariants after step i.
//
// The safety invariants must hold at every instant, and fail at once. The
// others hold once the locks have settled; the controller's own workers may
// still act on a late event (a lease loss the watchdog noticed after the
// step), so a first failure of those settles the locks again and checks once
// more before failing.
func (w *world) check(i int, what string) {
	w.t.Helper()
	if msg := w.checkOnce(i, what); msg != "" {
		w.settle("a failed check")
		if msg := w.checkOnce(i, what); msg != "" {
			w.t.Fatalf("step %d (%s): %s", i, what, msg)
		}
	}
}

// checkOnce fails the test on a broken safety invariant, and returns the
// first broken consistency invariant, or "".
func (w *world) checkOnce(i int, what string) (inconsistent string) {
	w.t.Helper()
	fail := func(format string, args ...any) {
		w.t.Helper()
		w.t.Fatalf("step %d (%s): %s", i, what, fmt.Sprintf(format, args...))
	}
	soft := func(format string, args ...any) {
		if inconsistent == "" {
			inconsistent = fmt.Sprintf(format, args...)
		}
	}
	pods := w.pods()
	byUID := map[types.UID]*corev1.Pod{}
	for i := range pods {
		byUID[pods[i].UID] = &pods[i]
	}
	infos := map[string]redislock.LockInfo{}
	holderOfKey := func(key string) (types.UID, int64) {
		info, ok := infos[key]
		if !ok {
			var err error
			info, err = w.operator.Inspect(w.ctx, key)
			w.must(err)
			infos[key] = info
		}
		if !info.Held() {
			return "", 0
		}
		owner := string(info.Holders[0].Owner)
		return types.UID(owner[:strings.LastIndexByte(owner, ':')]), info.Token
	}
	lockByName := map[string]*modelLock{}
	for _, l := range w.locks {
		if l.exists {
			lockByName[l.ns+"/"+l.name] = l
		}
	}

	for _, p := range pods {
		// A gate lifted since the last step: the lock lifting it exists.
		// The pod is now that key's guarded pod until it stops.
		for _, name := range w.gates[p.UID] {
			if hasPodGate(&p, gateFor(name)) || w.ungatedFor[p.UID][name] != "" {
				continue
			}
			l := lockByName[p.Namespace+"/"+name]
			if l == nil {
				fail("pod %s lost the gate of %s, which does not exist", p.Name, name)
			}
			if w.ungatedFor[p.UID] == nil {
				w.ungatedFor[p.UID] = map[string]string{}
			}
			w.ungatedFor[p.UID][name] = l.key
		}
		// Marks agree with Redis.
		for k := range p.Labels {
			name, ok := strings.CutPrefix(k, locksv1.HolderLabelPrefix)
			if !ok {
				continue
			}
			l := lockByName[p.Namespace+"/"+name]
			if l == nil {
				soft("pod %s carries the marks of %s, which does not exist", p.Name, name)
				continue
			}
			if isStopped(&p) {
				continue
			}
			uid, token := holderOfKey(l.key)
			if uid != p.UID {
				soft("pod %s carries the marks of %s, but %s is held by %q", p.Name, name, l.key, uid)
			}
			if got := p.Annotations[locksv1.TokenAnnotationPrefix+name]; got != strconv.FormatInt(token, 10) {
				soft("pod %s has token %s for %s, Redis %d", p.Name, got, name, token)
			}
		}
	}
	// At most one guarded pod per key is ungated and not yet stopped.
	guarded := map[string][]string{}
	for uid, byLock := range w.ungatedFor {
		p := byUID[uid]
		if p == nil {
			delete(w.ungatedFor, uid)
			continue
		}
		if isStopped(p) {
			continue
		}
		for name, key := range byLock {
			if key == released {
				continue
			}
			if !slices.Contains(guarded[key], p.Name) {
				guarded[key] = append(guarded[key], p.Name)
			}
			// Grants are sticky: the pod keeps the key until it stops.
			if holder, _ := holderOfKey(key); holder != p.UID {
				soft("pod %s was ungated by %s and has not stopped, but %s is held by %q", p.Name, name, key, holder)
			}
		}
	}
	for key, names := range guarded {
		if len(names) > 1 {
			fail("%d guarded pods are ungated and running for %s: %v", len(names), key, names)
		}
	}
	// The holder of each key is a live pod that has not stopped, and
	// carries the marks of the locks that select it.
	for _, l := range w.locks {
		if !l.exists {
			continue
		}
		uid, _ := holderOfKey(l.key)
		if uid == "" {
			continue
		}
		p := byUID[uid]
		if p == nil {
			soft("%s is held by %s, a pod that is gone", l.key, uid)
			continue
		}
		if isStopped(p) {
			soft("%s is held by %s, which has stopped", l.key, p.Name)
		}
		if p.Namespace == l.ns && slices.Contains(l.groups, p.Labels["group"]) && !markedBy(p, l.name) {
			soft("%s holds %s but lacks the marks of %s, which selects it", p.Name, l.key, l.name)
		}
	}
	return inconsistent
}

func hasPodGate(p *corev1.Pod, gate string) bool {
	return slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == gate })
}
