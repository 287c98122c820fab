package controllers_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/internal/envtestassets"
	"github.com/lockwarden/lockwarden/internal/manifests"
	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

var (
	scheme    = runtime.NewScheme()
	restCfg   *rest.Config
	k8s       client.Client
	redisAddr string
)

// TestMain starts a real kube-apiserver and etcd (envtest) with the CRD, and
// a real redis-server, shared by the package's tests.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrl.SetLogger(logr.Discard())
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := locksv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	var err error
	if env.BinaryAssetsDirectory, err = envtestassets.Dir(context.Background(), "..", os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if restCfg, err = env.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start envtest:", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	if k8s, err = client.New(restCfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := installAdmission(); err != nil {
		fmt.Fprintln(os.Stderr, "install the admission policies:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "controllers-redis")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	srv, err := redistest.StartServer(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.Stop()
	redisAddr = srv.Addr
	return m.Run()
}

// installAdmission creates the admission policies of config/admission, as
// an install does. The API server enforces them a moment later: a test
// relying on one waits for it (waitForFencing, waitForGating).
func installAdmission() error {
	for _, name := range []string{"fencing.yaml", "gate.yaml", "manager.yaml"} {
		data, err := os.ReadFile(filepath.Join("..", "config", "admission", name))
		if err != nil {
			return err
		}
		objects, err := manifests.Decode(data)
		if err != nil {
			return err
		}
		for _, obj := range objects {
			if err := k8s.Create(context.Background(), obj); err != nil {
				return err
			}
		}
	}
	return nil
}

// harness is one running manager with the controller, as cmd/manager runs it.
type harness struct {
	writes  atomic.Int64 // API writes by the controller's client
	metrics *prometheus.Registry
	stop    func()
	// r is the reconciler, for tests that drive it directly; cache is the
	// manager's cached client, which r reads through.
	r     *controllers.DistributedLockReconciler
	cache client.Client
}

// reconcilerOption configures the reconciler as a manager flag would.
type reconcilerOption func(*controllers.DistributedLockReconciler)

func startManager(t testing.TB, opts ...reconcilerOption) *harness {
	t.Helper()
	return startManagerOn(t, managerConfig{redisAddr: redisAddr}, opts...)
}

// managerConfig says where a test's manager works.
type managerConfig struct {
	redisAddr string
	// rdb, if set, is the Redis the manager uses instead of redisAddr's.
	rdb redis.UniversalClient
	// namespaces, if set, are the only ones the manager watches, so
	// managers running side by side leave each other's locks alone.
	namespaces []string
	// observe, if not nil, sees every object the controller wrote, after
	// the write.
	observe func(client.Object)
	// pods, if set, is the pod cache's filter (--pod-label-selector).
	pods labels.Selector
	// intercept, if not nil, is called before each API write by the
	// controller, with the subresource written ("" for the object), and
	// the function it returns, if any, with the write's outcome.
	intercept func(obj client.Object, subresource string) func(error)
	// frozen, while true, makes the manager's reads of pods and locks
	// return them as it last read them before (objects it never read are
	// missing): a cache that stopped at that moment, as a paused or deposed
	// manager's does. Its writes go to the API server as they are.
	frozen *atomic.Bool
	// failPodLists, while true, fails the manager's lists of pods, as an
	// API server that cannot answer them would.
	failPodLists *atomic.Bool
}

func startManagerOn(t testing.TB, cfg managerConfig, opts ...reconcilerOption) *harness {
	t.Helper()
	observe := cfg.observe
	cacheOpts := controllers.CacheOptions(cfg.pods)
	if len(cfg.namespaces) > 0 {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range cfg.namespaces {
			cacheOpts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	h := &harness{metrics: prometheus.NewRegistry()}
	count := func(obj client.Object, err error) {
		h.writes.Add(1)
		if observe != nil && err == nil {
			observe(obj)
		}
	}
	intercept, frozen, failPodLists := cfg.intercept, cfg.frozen, cfg.failPodLists
	if intercept == nil {
		intercept = func(client.Object, string) func(error) { return nil }
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cacheOpts,
		// Several managers run in one test process, one after another.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		// Under a machine's full load (the race detector, and other suites
		// beside this one) a stop once took longer than the default 30 s.
		// A stop that takes longer than this is reported with every
		// goroutine's stack (see h.stop).
		GracefulShutdownTimeout: ptr.To(2 * time.Minute),
		NewClient: func(cfg *rest.Config, opts client.Options) (client.Client, error) {
			c, err := client.NewWithWatch(cfg, opts)
			if err != nil {
				return nil, err
			}
			funcs := countWrites(intercept, count)
			if frozen != nil {
				freezeReads(&funcs, frozen)
			}
			if failPodLists != nil {
				list := funcs.List
				funcs.List = func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
					if _, pods := l.(*corev1.PodList); pods && failPodLists.Load() {
						return apierrors.NewServiceUnavailable("pod lists fail in this test")
					}
					if list != nil {
						return list(ctx, c, l, opts...)
					}
					return c.List(ctx, l, opts...)
				}
			}
			return interceptor.NewClient(c, funcs), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	rdb := cfg.rdb
	if rdb == nil {
		rdb = redis.NewClient(&redis.Options{Addr: cfg.redisAddr})
	}
	locks := controllers.NewLockClients(rdb, ctrl.Log, nil)
	metrics, err := controllers.NewMetrics(h.metrics, controllers.MetricsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := &controllers.DistributedLockReconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorderFor("lockwarden"),
		Locks:    locks,
		Metrics:  metrics,
	}
	for _, o := range opts {
		o(r)
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	h.r, h.cache = r, mgr.GetClient()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("the manager's cache did not sync")
	}
	var once atomic.Bool
	h.stop = func() {
		if !once.CompareAndSwap(false, true) {
			return
		}
		cancel()
		if err := <-done; err != nil {
			var buf strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
			t.Errorf("manager: %v\ngoroutines:\n%s", err, buf.String())
		}
		locks.Close()
		_ = rdb.Close()
	}
	t.Cleanup(h.stop)
	return h
}

// reconcileKey runs the manager's reconciler on the key at once, again
// while it fails on a write conflict (its cache may lag the controller's
// own writes, which every status write is preconditioned on, and the work
// queue would retry), and fails the test on any other error.
func reconcileKey(t testing.TB, h *harness, key string) ctrl.Result {
	t.Helper()
	for range 50 {
		res, err := h.r.Reconcile(context.Background(), controllers.KeyRequest{Key: key})
		if err == nil {
			return res
		}
		if !strings.Contains(err.Error(), "the object has been modified") {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("reconciling %s conflicted 50 times in a row", key)
	return ctrl.Result{}
}

// countWrites reports every write through the client, with its outcome,
// after showing it to intercept.
func countWrites(intercept func(client.Object, string) func(error), count func(client.Object, error)) interceptor.Funcs {
	write := func(obj client.Object, subresource string, do func() error) error {
		done := intercept(obj, subresource)
		err := do()
		if done != nil {
			done(err)
		}
		count(obj, err)
		return err
	}
	return interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			return write(obj, "", func() error { return c.Create(ctx, obj, opts...) })
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return write(obj, "", func() error { return c.Update(ctx, obj, opts...) })
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			return write(obj, "", func() error { return c.Patch(ctx, obj, patch, opts...) })
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return write(obj, "", func() error { return c.Delete(ctx, obj, opts...) })
		},
		SubResourceCreate: func(ctx context.Context, c client.Client, sub string, obj, subObj client.Object, opts ...client.SubResourceCreateOption) error {
			return write(obj, sub, func() error { return c.SubResource(sub).Create(ctx, obj, subObj, opts...) })
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			return write(obj, sub, func() error { return c.SubResource(sub).Update(ctx, obj, opts...) })
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			return write(obj, sub, func() error { return c.SubResource(sub).Patch(ctx, obj, patch, opts...) })
		},
	}
}

// freezeReads makes the client's reads of pods and locks, while frozen is
// true, return the copies it last read before (managerConfig.frozen).
func freezeReads(funcs *interceptor.Funcs, frozen *atomic.Bool) {
	var seen sync.Map // "<kind>/<namespace>/<name>" -> client.Object
	id := func(obj client.Object) string {
		return fmt.Sprintf("%T/%s/%s", obj, obj.GetNamespace(), obj.GetName())
	}
	// view records obj as read while not frozen, or replaces it with the
	// copy read before; it reports whether there is one.
	view := func(obj client.Object) bool {
		if !frozen.Load() {
			seen.Store(id(obj), obj.DeepCopyObject())
			return true
		}
		was, ok := seen.Load(id(obj))
		if !ok {
			return false
		}
		reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(was.(client.Object).DeepCopyObject()).Elem())
		return true
	}
	funcs.Get = func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if err := c.Get(ctx, key, obj, opts...); err != nil {
			return err
		}
		switch obj.(type) {
		case *corev1.Pod, *locksv1.DistributedLock:
			if !view(obj) {
				return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
			}
		}
		return nil
	}
	funcs.List = func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
		if err := c.List(ctx, list, opts...); err != nil {
			return err
		}
		switch l := list.(type) {
		case *corev1.PodList:
			l.Items = viewed(l.Items, view)
		case *locksv1.DistributedLockList:
			l.Items = viewed(l.Items, view)
		}
		return nil
	}
}

// viewed are the items as view shows them, without those it has no copy of.
func viewed[T any, P interface {
	*T
	client.Object
}](items []T, view func(client.Object) bool) []T {
	out := items[:0]
	for i := range items {
		if view(P(&items[i])) {
			out = append(out, items[i])
		}
	}
	return out
}

// newNamespace creates a namespace for one test, with the default service
// account pods need.
func newNamespace(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "lw-"}}
	if err := k8s.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "default"}}
	if err := k8s.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

type podOption func(*corev1.Pod)

// boundPod binds the pod to a node, so deleting it is graceful: it keeps
// existing with a deletionTimestamp, as until a kubelet confirms.
func boundPod(p *corev1.Pod) { p.Spec.NodeName = "node-1" }

func withLabels(l map[string]string) podOption {
	return func(p *corev1.Pod) { p.Labels = l }
}

// createPod creates a pod labelled app=<app>. No kubelet runs, so a pod that
// is not gated is set Running here, as a kubelet would.
func createPod(t testing.TB, ns, name, app string, opts ...podOption) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
	}
	for _, o := range opts {
		o(pod)
	}
	if err := k8s.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.SchedulingGates) == 0 {
		setPhase(t, pod, corev1.PodRunning)
	}
	return pod
}

// setPhase sets the pod's phase, as a kubelet reports it, retrying when
// the controller's patch of the marks got in between.
func setPhase(t testing.TB, pod *corev1.Pod, phase corev1.PodPhase) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := getPod(t, pod)
		p.Status.Phase = phase
		if err := k8s.Status().Update(context.Background(), p); err != nil {
			return err
		}
		p.DeepCopyInto(pod)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// labelPod sets a label of the pod with a merge patch, which no write of
// the controller's in between can make fail: a change that wakes the key.
func labelPod(t testing.TB, pod *corev1.Pod, label, value string) {
	t.Helper()
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, label, value))
	if err := k8s.Patch(context.Background(), pod, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
}

func createLock(t testing.TB, ns, name, app string, mutate ...func(*locksv1.DistributedLock)) *locksv1.DistributedLock {
	t.Helper()
	lock := newLock(ns, name, app)
	for _, m := range mutate {
		m(lock)
	}
	if err := k8s.Create(context.Background(), lock); err != nil {
		t.Fatal(err)
	}
	return lock
}

func newLock(ns, name, app string) *locksv1.DistributedLock {
	return &locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: locksv1.DistributedLockSpec{
			LeaseDuration: &metav1.Duration{Duration: 3 * time.Second},
			Candidates:    &locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"app": locksv1.LabelValue(app)}},
		},
	}
}

// updateLock changes the lock as mutate says, again on a conflict with the
// controller's own writes of it.
func updateLock(t testing.TB, lock *locksv1.DistributedLock, mutate func(*locksv1.DistributedLock)) {
	t.Helper()
	write := func(l *locksv1.DistributedLock) error { return k8s.Update(context.Background(), l) }
	if err := retryOnConflict(lock, mutate, write); err != nil {
		t.Fatal(err)
	}
}

// updateLockStatus changes the lock's status as mutate says, again on a
// conflict with the controller's own writes of it.
func updateLockStatus(t testing.TB, lock *locksv1.DistributedLock, mutate func(*locksv1.DistributedLock)) error {
	t.Helper()
	return retryOnConflict(lock, mutate, func(l *locksv1.DistributedLock) error { return k8s.Status().Update(context.Background(), l) })
}

func retryOnConflict(lock *locksv1.DistributedLock, mutate func(*locksv1.DistributedLock), write func(*locksv1.DistributedLock) error) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l := &locksv1.DistributedLock{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(lock), l); err != nil {
			return err
		}
		mutate(l)
		return write(l)
	})
}

// lockKey is the Redis key the lock names.
func lockKey(lock *locksv1.DistributedLock) string {
	if lock.Spec.Key != "" {
		return lock.Spec.Key
	}
	return lock.Namespace + "/" + lock.Name
}

func getLock(t testing.TB, lock *locksv1.DistributedLock) *locksv1.DistributedLock {
	t.Helper()
	got := &locksv1.DistributedLock{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(lock), got); err != nil {
		t.Fatal(err)
	}
	return got
}

func getPod(t testing.TB, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	got := &corev1.Pod{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(pod), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// holderOf is the pod name in the lock's status, "" when free, once the
// whole status shows it: a grant is recorded as the holder before its gate
// is lifted, and the rest of the status (conditions, waiting order) is
// written after.
func holderOf(t testing.TB, lock *locksv1.DistributedLock) string {
	st := getLock(t, lock).Status
	if h := st.Holder; h != nil {
		if c := meta.FindStatusCondition(st.Conditions, locksv1.ConditionHeld); c != nil && c.Message == "Held by pod "+h.PodName {
			return h.PodName
		}
		return "(being written)"
	}
	return ""
}

// eventually polls cond until it holds. The bound only keeps a broken test
// from hanging; it asserts no timing.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// inPodLock takes the key with an in-pod client of the pod, as an
// application would.
func inPodLock(t testing.TB, pod *corev1.Pod, key string) *redislock.Hold {
	t.Helper()
	m, err := lockClient(t, string(pod.UID)).NewMutex(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	hold, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return hold
}

func lockClient(t testing.TB, id string) *redislock.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	c, err := redislock.New(rdb, redislock.Options{ID: id, WatchdogLease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		_ = rdb.Close()
	})
	return c
}

func inspect(t testing.TB, key string) redislock.LockInfo {
	t.Helper()
	info, err := lockClient(t, "inspector").Inspect(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return info
}
