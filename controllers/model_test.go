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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
// redis-server, through random sequences of what a cluster does: pods
// created behind one or several locks' gates (some naming a lock that does
// not exist or does not select them), and behind another controller's
// gate, which that controller lifts later; the scheduler binding a pod once
// it has no gate left; a kubelet (model_kubelet_test.go) starting init
// containers, native sidecars and app containers, containers exiting and
// being restarted in place under restartPolicy OnFailure and Always, pods
// completing, graceful deletion (which a kubelet may learn of a step
// late), nodes lost, node clocks a second or two off; and lost leases,
// Redis restarts without persistence, manager restarts, selector edits,
// and locks deleted and created again, on three locks in two namespaces
// that share pods and a key. After every step it settles the locks by
// calling Reconcile until a pass writes nothing.
//
// The checker's oracle is the model, never the controller's code: a pod
// runs while a container the model's kubelet started has not stopped, or
// while its node is lost and the object is not force-deleted. It fails at
// once when:
//  1. two guarded pods of one key run at the same instant (checked at every
//     container start and after every step). A pod is a guarded pod of key
//     K from the step its gate of lock L was lifted while L named K, until
//     the model has stopped its containers for good (or the object is gone),
//     whatever happens to L meanwhile;
//  2. a lockwarden gate is lifted from a pod that Redis does not show as the
//     key's holder "<pod UID>:0" at the check after that step, or by a lock
//     that does not exist (nor does the manager lift anyone else's gate);
//  3. a pod holds a key as "<pod UID>:0" while it carries another
//     controller's gate, or is newly granted one while it carries the gate of
//     a lock that does not exist, is being deleted, or does not select it.
//
// Once the locks have settled (else it settles them again and checks once
// more), it also asserts that marks agree with Redis; that no key is held
// for a pod the model has stopped and told the API server so (a terminal
// phase), or that is gone; that a guarded pod keeps its key until it stops;
// and that the holder carries the marks of the locks that select it.
//
// A world of 1,000 steps or more fails if it lifted fewer than one gate in
// 50 steps, or never restarted a guarded pod's container in place, started
// a guarded pod's sidecar, lost a guarded pod's node or had an older
// kubelet leave a terminated pod Running: a controller that grants nothing,
// or a model that stopped playing these, would pass unseen.
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
				w.stepNo = i
				what := w.step()
				w.settle(what)
				if i%100 == 0 {
					w.verifyCache()
				}
				w.check(what)
			}
			t.Logf("%d steps in %v: %v", mine, time.Since(start).Round(time.Millisecond), w.counts)
			w.checkCoverage(mine)
		})
	}
}

// checkCoverage fails a run long enough to have played, but that did not
// play, what the model is for: a controller that grants nothing, or a
// model that no longer restarts guarded pods' containers, would otherwise
// pass.
func (w *world) checkCoverage(steps int) {
	if steps < 1000 {
		return
	}
	if lifts := w.counts["(a gate lifted)"]; lifts < steps/50 {
		w.t.Errorf("%d steps lifted %d gates, fewer than one every 50 steps", steps, lifts)
	}
	for _, what := range []string{
		"(a guarded pod's container restarted in place)", "(a guarded pod's sidecar started)",
		"(a guarded pod's node lost)", "(an older kubelet left a terminated pod Running)",
	} {
		if w.counts[what] == 0 {
			w.t.Errorf("%d steps never played %s", steps, what)
		}
	}
}

// world is the model: the cluster as the test plays kubelet, scheduler,
// other controllers and administrator, and what the checker remembers
// between steps.
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
	// stepNo and what name the step being played, for failure messages.
	stepNo int
	what   string
	// mpods are the model's pods, oldest first, until the check after
	// they are gone; byUID finds them, and gone names the pods that are
	// gone.
	mpods []*modelPod
	byUID map[types.UID]*modelPod
	gone  map[types.UID]string
	// nodes are the nodes that report, and skew how far each one's clock
	// is off; nodeSeq names the next one.
	nodes   []string
	skew    map[string]time.Duration
	nodeSeq int
	// prevHolders are the owners Redis showed for each key at the last
	// check, and prevBad each pod's gates that no lock could lift then.
	prevHolders map[string]string
	prevBad     map[types.UID][]string
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
	keys     []string // the keys it may be created with; keys[0] first
	key      string
	groups   []string // it selects pods whose label group is one of these
	// exists: the API server has the lock, perhaps being deleted
	// (terminating).
	exists, terminating bool
}

var modelGroups = [][]string{{"a"}, {"b"}, {"a", "b"}}

// foreignGate is another controller's scheduling gate, as Kueue's.
const foreignGate = "example.com/admission"

// ghostLock is the name of a lock that never exists.
const ghostLock = "ghost"

func newWorld(t *testing.T, seed uint64) *world {
	w := &world{
		t: t, ctx: context.Background(), rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		redis: redistest.Start(t), counts: map[string]int{},
		byUID: map[types.UID]*modelPod{}, gone: map[types.UID]string{}, skew: map[string]time.Duration{},
		prevHolders: map[string]string{}, prevBad: map[types.UID][]string{},
		expect: newExpectations(),
	}
	for range 3 {
		w.addNode()
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

// addNode adds a node; half of them have a clock a second or two off.
func (w *world) addNode() {
	w.nodeSeq++
	node := fmt.Sprintf("node-%d", w.nodeSeq)
	w.nodes = append(w.nodes, node)
	w.skew[node] = time.Duration([]int{0, 0, 0, 0, 1, 2, -1, -2}[w.rng.IntN(8)]) * time.Second
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

// createLock creates the lock, and reports false if one of its name is
// still being deleted.
func (w *world) createLock(l *modelLock, key string) bool {
	lock := &locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: l.ns, Name: l.name},
		Spec: locksv1.DistributedLockSpec{
			Key:           key,
			LeaseDuration: &metav1.Duration{Duration: 5 * time.Second},
			Candidates:    groupSelector(l.groups),
		},
	}
	if err := k8s.Create(w.ctx, lock); apierrors.IsAlreadyExists(err) {
		return false
	} else if err != nil {
		w.t.Fatal(err)
	}
	w.expect.created(lock)
	l.key, l.exists, l.terminating = key, true, false
	return true
}

func groupSelector(groups []string) *locksv1.PodSelector {
	var values []locksv1.LabelValue
	for _, g := range groups {
		values = append(values, locksv1.LabelValue(g))
	}
	return &locksv1.PodSelector{MatchExpressions: []locksv1.LabelRequirement{{Key: "group", Operator: "In", Values: values}}}
}

// lockNamed is the model's lock of that name in the namespace, or nil.
func (w *world) lockNamed(ns, name string) *modelLock {
	for _, l := range w.locks {
		if l.ns == ns && l.name == name {
			return l
		}
	}
	return nil
}

// pods are the model's pods as the API server had them when the locks
// last settled.
func (w *world) pods() []corev1.Pod { return w.podsNow }

// onPod is an event that plays act on a random model pod that ok accepts,
// and reports false if there is none.
func (w *world) onPod(ok func(*modelPod) bool, act func(*modelPod)) func() bool {
	return func() bool {
		var matching []*modelPod
		for _, p := range w.mpods {
			if !p.gone && ok(p) {
				matching = append(matching, p)
			}
		}
		if len(matching) == 0 {
			return false
		}
		act(matching[w.rng.IntN(len(matching))])
		return true
	}
}

// onContainer is an event that plays act on a random container that ok
// accepts, of a random model pod that has one.
func (w *world) onContainer(ok func(*modelPod, *modelContainer) bool, act func(*modelPod, *modelContainer)) func() bool {
	return w.onPod(func(p *modelPod) bool {
		return slices.ContainsFunc(p.cs, func(c *modelContainer) bool { return ok(p, c) })
	},
		func(p *modelPod) {
			cs := slices.DeleteFunc(slices.Clone(p.cs), func(c *modelContainer) bool { return !ok(p, c) })
			act(p, cs[w.rng.IntN(len(cs))])
		})
}

func (w *world) note(p *modelPod, format string, args ...any) { p.note(w.stepNo, format, args...) }

// exitCode is a random exit code: success half the time.
func (w *world) exitCode() int32 { return []int32{0, 0, 0, 1, 1, 137}[w.rng.IntN(6)] }

// step plays one random event and says what it was.
func (w *world) step() string {
	pods := w.pods()
	type event struct {
		weight int
		name   string
		run    func() bool
	}
	events := []event{
		{14, "create pod", func() bool { return w.createPod(pods) }},
		{4, "admission controller lifts its gate", w.onPod(func(p *modelPod) bool { return p.foreign && !p.deleting }, w.liftForeignGate)},
		{12, "scheduler binds a pod with no gate left", func() bool {
			var free []*modelPod
			for i := range pods {
				p := w.byUID[pods[i].UID]
				if len(pods[i].Spec.SchedulingGates) == 0 && pods[i].Spec.NodeName == "" && pods[i].DeletionTimestamp.IsZero() && p != nil && !p.gone {
					free = append(free, p)
				}
			}
			if len(free) == 0 {
				return false
			}
			w.bind(free[w.rng.IntN(len(free))])
			return true
		}},
		{10, "kubelet starts containers", w.onPod(func(p *modelPod) bool { return len(p.startable()) > 0 }, w.startContainers)},
		{14, "a container exits", w.onContainer(func(p *modelPod, c *modelContainer) bool { return !p.lost && c.state == isRunning },
			func(p *modelPod, c *modelContainer) {
				code := w.exitCode()
				c.exit(code, p.now())
				w.note(p, "container %s exits %d", c.name, code)
				if p.awaitsRestart(c) && w.rng.IntN(3) == 0 {
					c.state = backOff
				}
				w.react(p)
			})},
		{10, "kubelet restarts a container in place", w.onContainer(func(p *modelPod, c *modelContainer) bool { return p.awaitsRestart(c) },
			func(p *modelPod, c *modelContainer) {
				if c.state == hasExited && w.rng.IntN(2) == 0 {
					c.state = backOff
					w.note(p, "container %s backs off", c.name)
				} else {
					c.start(p.now())
					w.note(p, "container %s restarted (restart %d)", c.name, c.restarts)
					if len(p.guarded) > 0 {
						w.counts["(a guarded pod's container restarted in place)"]++
					}
					w.checkExclusive()
				}
				w.react(p)
			})},
		{4, "kubelet stops the sidecars of a finished pod", w.onPod(func(p *modelPod) bool {
			return !p.lost && !p.terminal && !p.terminating && p.finishing() && len(p.runningContainers()) > 0
		}, func(p *modelPod) {
			w.kill(p, true)
			w.react(p)
		})},
		// Mostly running pods on a node, whose deletion is graceful: the path
		// where a holder runs on after its deletion.
		{7, "delete with grace", w.onPod(func(p *modelPod) bool { return !p.deleting && p.node != "" && !p.terminal }, w.deletePod)},
		{3, "delete with grace (a pod not running on a node)", w.onPod(func(p *modelPod) bool { return !p.deleting && (p.node == "" || p.terminal) }, w.deletePod)},
		{4, "kubelet sees the deletion", w.onPod(func(p *modelPod) bool { return p.deleting && !p.terminating && !p.lost }, w.seeDeletion)},
		{6, "grace period ends: kubelet kills the containers", w.onPod(func(p *modelPod) bool { return p.terminating && !p.terminal }, func(p *modelPod) {
			// The app containers first; the sidecars with them, or at the
			// next call.
			w.kill(p, w.rng.IntN(3) > 0)
			w.react(p)
		})},
		{6, "kubelet removes a terminated pod", w.onPod(func(p *modelPod) bool { return p.terminating && p.terminal }, func(p *modelPod) {
			w.forceDelete(p, "kubelet removes the pod")
		})},
		{1, "a node is lost", w.onPod(func(p *modelPod) bool { return p.node != "" && !p.lost && !p.terminal }, w.loseNode)},
		{3, "taint manager evicts a pod of a lost node", w.onPod(func(p *modelPod) bool { return p.lost && !p.deleting }, w.deletePod)},
		{2, "administrator force-deletes a pod of a lost node", w.onPod(func(p *modelPod) bool { return p.lost }, func(p *modelPod) {
			w.forceDelete(p, "administrator force-deletes the pod")
		})},
		{2, "pod GC fails and removes a pod of an out-of-service node", w.onPod(func(p *modelPod) bool { return p.lost }, w.podGC)},
		{4, "lease lost in Redis", func() bool {
			l := w.locks[w.rng.IntN(len(w.locks))]
			info, err := w.operator.Inspect(w.ctx, l.key)
			w.must(err)
			if !info.Held() {
				return false
			}
			owner := string(info.Holders[0].Owner)
			_, err = w.operator.ForceReleaseClient(w.ctx, l.key, owner[:strings.LastIndexByte(owner, ':')])
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
			if !l.exists || l.terminating {
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
		{1, "lock deleted", func() bool {
			l := w.locks[w.rng.IntN(len(w.locks))]
			if !l.exists || l.terminating {
				return false
			}
			lock := &locksv1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: l.ns, Name: l.name}}
			w.must(k8s.Delete(w.ctx, lock))
			w.expect.deleted(lock)
			l.terminating = true
			return true
		}},
		{2, "lock created again, perhaps with another key", func() bool {
			// While the lock is being deleted, its name cannot be taken:
			// the creation fails, and is tried again at a later step.
			l := w.locks[w.rng.IntN(len(w.locks))]
			if l.exists && !l.terminating {
				return false
			}
			return w.createLock(l, l.keys[w.rng.IntN(len(l.keys))])
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
				w.what = e.name
				if e.run() {
					w.counts[e.name]++
					return e.name
				}
				break
			}
		}
	}
}

// loseNode plays the loss of the pod's node: its kubelet reports nothing
// more, and new pods go to a new node.
func (w *world) loseNode(p *modelPod) {
	node := p.node
	w.nodes = slices.DeleteFunc(w.nodes, func(n string) bool { return n == node })
	w.addNode()
	for _, q := range w.mpods {
		if q.node == node && !q.gone {
			q.lost = true
			w.note(q, "node %s lost", node)
			if len(q.guarded) > 0 && q.running() {
				w.counts["(a guarded pod's node lost)"]++
			}
		}
	}
}

// createPod creates a pod in a random namespace and group, with a random
// restart policy and containers, behind the gates of a random subset of its
// namespace's locks (existing or not), sometimes the gate of a lock that
// never exists, and sometimes another controller's gate. A pod with no gate
// at all is unguarded, and is scheduled at once.
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
	group := []string{"a", "b"}[w.rng.IntN(2)]
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p%d", w.seq), Labels: map[string]string{"group": group}},
		Spec:       newModelPodSpec(w.rng.IntN),
	}
	p := &modelPod{ns: ns, name: pod.Name, group: group, spec: pod.Spec, cs: modelContainers(pod.Spec),
		oldKubelet: w.rng.IntN(4) == 0, guarded: map[string]string{}}
	for _, l := range w.locks {
		if l.ns == ns && w.rng.IntN(3) > 0 {
			p.lockGates = append(p.lockGates, l.name)
		}
	}
	if w.rng.IntN(10) == 0 {
		p.lockGates = append(p.lockGates, ghostLock)
	}
	for _, name := range p.lockGates {
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: gateFor(name)})
	}
	if p.foreign = w.rng.IntN(4) == 0; p.foreign {
		at := w.rng.IntN(len(pod.Spec.SchedulingGates) + 1)
		pod.Spec.SchedulingGates = slices.Insert(pod.Spec.SchedulingGates, at, corev1.PodSchedulingGate{Name: foreignGate})
	}
	w.must(k8s.Create(w.ctx, pod))
	w.expect.created(pod)
	p.uid = pod.UID
	w.mpods = append(w.mpods, p)
	w.byUID[p.uid] = p
	w.note(p, "created (%s, gates %v)", pod.Spec.RestartPolicy, pod.Spec.SchedulingGates)
	if len(pod.Spec.SchedulingGates) == 0 {
		w.bind(p)
	}
	return true
}

// liftForeignGate plays the other controller: it removes its own gate,
// and nothing else.
func (w *world) liftForeignGate(p *modelPod) {
	latest := &corev1.Pod{}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(w.ctx, client.ObjectKey{Namespace: p.ns, Name: p.name}, latest); err != nil {
			return err
		}
		latest.Spec.SchedulingGates = slices.DeleteFunc(latest.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == foreignGate })
		return k8s.Update(w.ctx, latest)
	})
	w.must(err)
	w.expect.wrote(latest)
	p.foreign = false
	w.note(p, "foreign gate lifted")
}

// bind plays the scheduler, then the kubelet's first sync of the pod.
func (w *world) bind(p *modelPod) {
	node := w.nodes[w.rng.IntN(len(w.nodes))]
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name}, Target: corev1.ObjectReference{Kind: "Node", Name: node}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name}}
	if err := k8s.SubResource("binding").Create(w.ctx, pod, binding); err != nil {
		w.t.Fatalf("bind %s: %v", p.name, err)
	}
	p.node, p.skew = node, w.skew[node]
	w.note(p, "bound to %s", node)
	if w.rng.IntN(3) > 0 {
		w.startContainers(p)
	}
	w.react(p)
}

// startContainers plays the kubelet starting what it can start now.
func (w *world) startContainers(p *modelPod) {
	now := p.now()
	for _, c := range p.startable() {
		c.start(now)
		w.note(p, "container %s started", c.name)
		if c.kind == sidecarKind && len(p.guarded) > 0 {
			w.counts["(a guarded pod's sidecar started)"]++
		}
	}
	w.checkExclusive()
}

// kill plays the kubelet stopping the running app (and regular init)
// containers, and the sidecars too if sidecars is set or nothing else runs.
func (w *world) kill(p *modelPod, sidecars bool) {
	now := p.now()
	running := p.runningContainers()
	others := slices.ContainsFunc(running, func(c *modelContainer) bool { return c.kind != sidecarKind })
	for _, c := range running {
		if c.kind == sidecarKind && others && !sidecars {
			continue
		}
		code := []int32{0, 137, 143}[w.rng.IntN(3)]
		c.exit(code, now)
		w.note(p, "container %s killed (%d)", c.name, code)
	}
}

// react plays what the kubelet does on its own after the pod's containers
// changed, then writes the pod's status as the kubelet would.
func (w *world) react(p *modelPod) {
	if p.lost || p.gone {
		return
	}
	if !p.terminal && !p.terminating && p.finishing() {
		// The app containers are done for good: the kubelet stops the
		// sidecars (here, or at a later step). After a regular init
		// container failed under Never, the pod is Failed at once, so it
		// stops them before it says so.
		failed := slices.ContainsFunc(p.cs, func(c *modelContainer) bool { return c.kind == initKind && c.state == hasExited && c.exitCode != 0 })
		if failed || w.rng.IntN(2) == 0 {
			w.kill(p, true)
		}
	}
	if !p.terminal {
		quiet := len(p.runningContainers()) == 0
		st := p.status(p.now())
		terminalPhase := st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed
		switch {
		case p.terminating && quiet:
			p.terminal = true // nothing is restarted in a pod being deleted
		case !p.terminating && terminalPhase != (quiet && p.finishing()):
			w.t.Fatalf("model error at step %d: phase %s, but finishing %v and quiet %v\n%s", w.stepNo, st.Phase, p.finishing(), quiet, p.describe())
		case terminalPhase:
			p.terminal = true
		}
		if p.terminal {
			w.note(p, "every container stopped for good")
		}
	}
	w.report(p)
}

// report writes the pod's status as the kubelet computes it, retrying when
// a patch of the controller got in between. The kubelet of a lost node
// reports nothing.
func (w *world) report(p *modelPod) {
	if p.lost || p.gone {
		return
	}
	latest := &corev1.Pod{}
	var st corev1.PodStatus
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(w.ctx, client.ObjectKey{Namespace: p.ns, Name: p.name}, latest); err != nil {
			return err
		}
		if !p.deleting || p.terminating {
			p.seenGeneration = latest.Generation
		}
		scheduled := latest.CreationTimestamp
		if c := slices.IndexFunc(latest.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodScheduled }); c >= 0 {
			scheduled = latest.Status.Conditions[c].LastTransitionTime
		}
		st = p.status(scheduled)
		latest.Status = st
		return k8s.Status().Update(w.ctx, latest)
	})
	if err != nil {
		w.t.Fatalf("step %d: the kubelet's status of %s was refused: %v\n%s", w.stepNo, p.name, err, p.describe())
	}
	w.expect.wrote(latest)
	if p.terminal && p.terminating && p.oldKubelet && st.Phase == corev1.PodRunning {
		w.counts["(an older kubelet left a terminated pod Running)"]++
	}
	if st.Phase != p.phase {
		w.note(p, "reported phase %s", st.Phase)
	}
	if st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed {
		p.phase = st.Phase
	}
}

// deletePod deletes the pod with its grace period. The API server removes
// a pod that is not bound, or is in a terminal phase, at once; else the
// kubelet (if its node reports) lets the containers run through the grace
// period, and a pod with nothing running is terminated at once.
func (w *world) deletePod(p *modelPod) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, UID: p.uid}}
	w.must(k8s.Delete(w.ctx, pod))
	latest := &corev1.Pod{}
	if err := k8s.Get(w.ctx, client.ObjectKeyFromObject(pod), latest); apierrors.IsNotFound(err) {
		w.expect.removed(pod)
		w.setGone(p, "deleted: removed at once")
		return
	} else if err != nil {
		w.t.Fatal(err)
	}
	w.expect.deleted(pod)
	p.deleting = true
	w.note(p, "deleted with grace")
	if !p.lost && w.rng.IntN(2) == 0 {
		w.seeDeletion(p)
	}
}

// seeDeletion plays the kubelet learning that the pod is being deleted:
// it restarts nothing from then on, lets the containers run through the
// grace period, and terminates the pod at once if nothing runs.
func (w *world) seeDeletion(p *modelPod) {
	p.terminating = true
	w.note(p, "its kubelet sees the deletion")
	w.react(p)
}

func (w *world) forceDelete(p *modelPod, why string) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, UID: p.uid}}
	w.must(client.IgnoreNotFound(k8s.Delete(w.ctx, pod, client.GracePeriodSeconds(0))))
	w.expect.removed(pod)
	w.setGone(p, why)
}

func (w *world) setGone(p *modelPod, why string) {
	p.gone = true
	w.gone[p.uid] = p.name
	w.note(p, "%s: gone", why)
}

// podGC plays the pod garbage collector on a node the administrator
// declared out of service: it marks the pod Failed (its container statuses
// as they were), then force-deletes it, here or at a later step. The model
// takes the administrator's word: the node's containers stopped.
func (w *world) podGC(p *modelPod) {
	if p.podGCFailed || p.phase != "" {
		w.forceDelete(p, "pod GC removes the pod")
		return
	}
	for _, c := range p.runningContainers() {
		c.exit(137, p.now())
	}
	p.terminal, p.podGCFailed = true, true
	latest := &corev1.Pod{}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(w.ctx, client.ObjectKey{Namespace: p.ns, Name: p.name}, latest); err != nil {
			return err
		}
		latest.Status.Phase = corev1.PodFailed
		latest.Status.ObservedGeneration = latest.Generation
		latest.Status.Conditions = append(latest.Status.Conditions, corev1.PodCondition{
			Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByPodGC", LastTransitionTime: metav1.Now(),
		})
		return k8s.Status().Update(w.ctx, latest)
	})
	w.must(err)
	w.expect.wrote(latest)
	p.phase = corev1.PodFailed
	w.note(p, "pod GC marks it Failed")
	if w.rng.IntN(2) == 0 {
		w.forceDelete(p, "pod GC removes the pod")
	}
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
		quiet := w.reconcilePass()
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

// reconcilePass calls Reconcile once for each key the locks name (and for
// each lock being deleted), and reports whether none of them failed or
// asked for a retry soon.
func (w *world) reconcilePass() (quiet bool) {
	quiet = true
	settled := map[string]bool{}
	for _, l := range w.locksNow {
		// One reconcile settles every lock naming a key, those being
		// deleted included.
		key := l.Spec.Key
		if key == "" {
			key = l.Namespace + "/" + l.Name
		}
		if settled[key] {
			continue
		}
		settled[key] = true
		res, err := w.h.r.Reconcile(w.ctx, controllers.KeyRequest{Key: key})
		// A look asked for soon means a retry (Redis failed, a conflict);
		// a later one is a holder's start deadline.
		if err != nil || (res.RequeueAfter > 0 && res.RequeueAfter <= 2*time.Second) {
			quiet = false
		}
	}
	return quiet
}

// syncLocks records which locks exist, and which are being deleted.
func (w *world) syncLocks() {
	for _, l := range w.locks {
		i := slices.IndexFunc(w.locksNow, func(x locksv1.DistributedLock) bool { return x.Namespace == l.ns && x.Name == l.name })
		l.exists = i >= 0
		l.terminating = l.exists && !w.locksNow[i].DeletionTimestamp.IsZero()
		if l.exists && w.locksNow[i].Spec.Key != l.key {
			w.t.Fatalf("model error: lock %s names %s, the model says %s", l.name, w.locksNow[i].Spec.Key, l.key)
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
// terminating, or, after a removal, gone.
type expectations struct {
	mu      sync.Mutex
	minRV   map[expectKey]uint64
	present map[expectKey]bool // created by the test: must be in the cache
	// gone are the deleted objects: true if they must be gone, false if
	// they may be terminating.
	gone map[expectKey]bool
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

// deleted records a delete: the object is gone, or terminating.
func (e *expectations) deleted(obj client.Object) { e.deletedAs(obj, false) }

// removed records a delete that removed the object.
func (e *expectations) removed(obj client.Object) { e.deletedAs(obj, true) }

func (e *expectations) deletedAs(obj client.Object, removed bool) {
	if k, ok := keyOf(obj); ok {
		e.mu.Lock()
		e.gone[k] = e.gone[k] || removed
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
	for k, removed := range e.gone {
		if obj, found := get(k); found && (removed || obj.GetDeletionTimestamp() == nil) {
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

// fail fails the test at once, naming the step.
func (w *world) fail(format string, args ...any) {
	w.t.Helper()
	w.t.Fatalf("step %d (%s): %s", w.stepNo, w.what, fmt.Sprintf(format, args...))
}

// checkExclusive asserts invariant 1: at most one guarded pod per key runs,
// by the model's own account of which containers run. It is called at
// every container start, and after every step.
func (w *world) checkExclusive() {
	w.t.Helper()
	byKey := map[string][]*modelPod{}
	for _, p := range w.mpods {
		if p.running() {
			for _, key := range p.keys() {
				byKey[key] = append(byKey[key], p)
			}
		}
	}
	for _, key := range slices.Sorted(mapKeys(byKey)) {
		if runs := byKey[key]; len(runs) > 1 {
			var b strings.Builder
			for _, p := range runs {
				b.WriteString("\n" + p.describe())
			}
			w.fail("%d guarded pods of %s run at once:%s", len(runs), key, b.String())
		}
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// check asserts the invariants after the step.
//
// The safety invariants must hold at every instant, and fail at once. The
// others hold once the locks have settled; the controller's own workers may
// still act on a late event (a lease loss the watchdog noticed after the
// step), so a first failure of those settles the locks again and checks once
// more before failing.
func (w *world) check(what string) {
	w.t.Helper()
	w.what = what
	if msg := w.checkOnce(); msg != "" {
		w.settle("a failed check")
		if msg := w.checkOnce(); msg != "" {
			w.fail("%s", msg)
		}
	}
	// Forget the pods that are gone: they run nothing, and guard nothing.
	w.mpods = slices.DeleteFunc(w.mpods, func(p *modelPod) bool {
		if p.gone {
			delete(w.byUID, p.uid)
			delete(w.prevBad, p.uid)
		}
		return p.gone
	})
}

// redisHolders reads who holds each key the locks may name, and its token.
type redisHolder struct {
	owner string
	uid   types.UID
	token int64
}

func (w *world) redisHolders() map[string]redisHolder {
	out := map[string]redisHolder{}
	for _, l := range w.locks {
		for _, key := range l.keys {
			if _, ok := out[key]; ok {
				continue
			}
			info, err := w.operator.Inspect(w.ctx, key)
			w.must(err)
			var h redisHolder
			if info.Held() {
				h.owner = string(info.Holders[0].Owner)
				h.uid = types.UID(h.owner[:strings.LastIndexByte(h.owner, ':')])
				h.token = info.Token
			}
			out[key] = h
		}
	}
	return out
}

// grantOwner is the owner ID of the controller's grant of a key to the pod.
func grantOwner(uid types.UID) string { return string(uid) + ":0" }

// badGates are the pod's lockwarden gates that no lock can lift now: the
// lock does not exist, is being deleted, or does not select the pod.
func (w *world) badGates(pod *corev1.Pod) []string {
	var bad []string
	for _, g := range pod.Spec.SchedulingGates {
		name, ok := strings.CutPrefix(g.Name, locksv1.GatePrefix)
		if !ok {
			continue
		}
		switch l := w.lockNamed(pod.Namespace, name); {
		case l == nil || !l.exists:
			bad = append(bad, name+" (does not exist)")
		case l.terminating:
			bad = append(bad, name+" (is being deleted)")
		case !slices.Contains(l.groups, pod.Labels["group"]):
			bad = append(bad, name+" (does not select it)")
		}
	}
	return bad
}

// checkOnce fails the test on a broken safety invariant, and returns the
// first broken consistency invariant, or "".
func (w *world) checkOnce() (inconsistent string) {
	w.t.Helper()
	soft := func(format string, args ...any) {
		if inconsistent == "" {
			inconsistent = fmt.Sprintf(format, args...)
		}
	}
	holders := w.redisHolders()
	apiPods := map[types.UID]*corev1.Pod{}
	for i := range w.podsNow {
		pod := &w.podsNow[i]
		apiPods[pod.UID] = pod
		if w.byUID[pod.UID] == nil {
			w.fail("pod %s is none of the model's, or the model thinks it is gone", pod.Name)
		}
	}
	for _, p := range w.mpods {
		pod := apiPods[p.uid]
		if pod == nil {
			if !p.gone {
				w.fail("pod %s vanished: only the model deletes pods\n%s", p.name, p.describe())
			}
			continue
		}
		// Nobody but the other controller lifts its gate: the manager
		// writes only its own.
		if p.foreign && !hasPodGate(pod, foreignGate) {
			w.fail("pod %s lost %s, which only its own controller lifts\n%s", p.name, foreignGate, p.describe())
		}
		// Invariant 2: a gate lifted since the last check was lifted by a
		// lock that exists, from the pod Redis shows holding its key.
		for _, name := range p.lockGates {
			if hasPodGate(pod, gateFor(name)) {
				continue
			}
			if _, seen := p.guarded[name]; seen {
				continue
			}
			l := w.lockNamed(p.ns, name)
			if l == nil || !l.exists {
				w.fail("pod %s lost the gate of %s, which does not exist\n%s", p.name, name, p.describe())
			}
			if got := holders[l.key].owner; got != grantOwner(p.uid) {
				w.fail("pod %s lost the gate of %s, but Redis shows %s held by %q, not %q\n%s", p.name, name, l.key, got, grantOwner(p.uid), p.describe())
			}
			p.guarded[name] = l.key
			w.note(p, "gate of %s lifted: a guarded pod of %s", name, l.key)
			w.counts["(a gate lifted)"]++
		}
	}
	// Invariant 1, after the step.
	w.checkExclusive()
	// Invariant 3: a pod is granted a key only when it carries no other
	// controller's gate, and no gate that no lock can lift.
	bad := map[types.UID][]string{}
	for uid, pod := range apiPods {
		bad[uid] = w.badGates(pod)
	}
	for _, key := range slices.Sorted(mapKeys(holders)) {
		h := holders[key]
		p := w.byUID[h.uid]
		if h.owner == "" || p == nil || h.owner != grantOwner(p.uid) {
			continue
		}
		if p.foreign {
			w.fail("pod %s holds %s, but still carries %s\n%s", p.name, key, foreignGate, p.describe())
		}
		if h.owner == w.prevHolders[key] {
			continue
		}
		before, ok := w.prevBad[p.uid]
		if !ok {
			before = bad[p.uid] // created in this step, when no lock changed
		}
		if both := slices.DeleteFunc(slices.Clone(bad[p.uid]), func(g string) bool { return !slices.Contains(before, g) }); len(both) > 0 {
			w.fail("pod %s was granted %s while it carries the gate of %s\n%s", p.name, key, strings.Join(both, ", "), p.describe())
		}
	}

	// The consistency invariants. Marks agree with Redis.
	for _, p := range w.mpods {
		pod := apiPods[p.uid]
		if pod == nil || p.stoppedForGood() {
			continue
		}
		for k := range pod.Labels {
			name, ok := strings.CutPrefix(k, locksv1.HolderLabelPrefix)
			if !ok {
				continue
			}
			l := w.lockNamed(p.ns, name)
			if l == nil || !l.exists {
				soft("pod %s carries the marks of %s, which does not exist", p.name, name)
				continue
			}
			if l.terminating {
				continue
			}
			if h := holders[l.key]; h.uid != p.uid {
				soft("pod %s carries the marks of %s, but %s is held by %q", p.name, name, l.key, h.owner)
			} else if got := pod.Annotations[locksv1.TokenAnnotationPrefix+name]; got != strconv.FormatInt(h.token, 10) {
				soft("pod %s has token %s for %s, Redis %d", p.name, got, name, h.token)
			}
		}
		// Grants are sticky: a guarded pod keeps its key until it stops,
		// whatever happened to the lock that lifted its gate.
		for name, key := range p.guarded {
			if h := holders[key]; h.uid != p.uid {
				soft("pod %s was ungated by %s and has not stopped, but %s is held by %q\n%s", p.name, name, key, h.owner, p.describe())
			}
		}
	}
	// No key is held for a pod that is gone, or that the kubelet reported
	// stopped; the holder carries the marks of the locks that select it.
	for _, key := range slices.Sorted(mapKeys(holders)) {
		h := holders[key]
		if h.owner == "" {
			continue
		}
		if name, ok := w.gone[h.uid]; ok {
			soft("%s is held by %s, a pod that is gone", key, name)
			continue
		}
		p := w.byUID[h.uid]
		if p == nil {
			continue
		}
		if p.reportedStopped() {
			soft("%s is held by %s, which the kubelet reported stopped (phase %s)\n%s", key, p.name, p.phase, p.describe())
			continue
		}
		for _, l := range w.locks {
			if l.exists && !l.terminating && l.key == key && l.ns == p.ns && slices.Contains(l.groups, p.group) && !markedBy(apiPods[p.uid], l.name) {
				soft("%s holds %s but lacks the marks of %s, which selects it", p.name, key, l.name)
			}
		}
	}
	if inconsistent == "" {
		for key, h := range holders {
			w.prevHolders[key] = h.owner
		}
		w.prevBad = bad
	}
	return inconsistent
}

func hasPodGate(p *corev1.Pod, gate string) bool {
	return slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == gate })
}
