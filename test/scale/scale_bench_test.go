// Package scale benchmarks the manager binary at cluster scale (issue 15):
// thousands of DistributedLocks among a hundred thousand pods, on a real
// kube-apiserver and etcd (envtest) and a real redis-server. It holds only a
// benchmark, so `make test` compiles it and runs nothing; `make bench` runs
// it.
package scale

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/envtestassets"
	"github.com/lockwarden/lockwarden/internal/redistest"
)

// config is one run's size, from the environment, defaulting to issue 15's.
type config struct {
	locks      int // DistributedLocks, each with candidatesPerLock pods
	others     int // pods no lock selects
	namespaces int // the locks and pods are spread round-robin over these
	workers    int // concurrent creators during setup
	churn      int // unrelated pod label updates a second
	samples    int // locks handed over for the hand-over latencies
	lease      time.Duration
	reconcile  int // --max-concurrent-reconciles; 0 leaves the manager's default
	// podFilter runs the manager with --pod-label-selector=candidateLabel,
	// which only the candidate pods carry, so it caches none of the others.
	podFilter bool
	// memLimit is the manager's GOMEMLIMIT, "" for none. In a container the
	// manager sets it itself, to the container's limit less 64 MiB (see
	// cmd/manager/memlimit.go): 192 MiB of config/manager's 256 MiB.
	memLimit string
	// profiles, if set, is where the manager's heap profile (at the end)
	// and CPU profile (30 s while granting) are written.
	profiles string
}

// candidateLabel is the label the candidate pods opt in with.
const candidateLabel = "lockwarden.dev/candidate"

const candidatesPerLock = 3

func configFromEnv(b *testing.B) config {
	c := config{
		locks:      envInt(b, "LOCKWARDEN_SCALE_LOCKS", 10000),
		others:     envInt(b, "LOCKWARDEN_SCALE_PODS", 100000),
		namespaces: envInt(b, "LOCKWARDEN_SCALE_NAMESPACES", 100),
		workers:    envInt(b, "LOCKWARDEN_SCALE_WORKERS", 24),
		churn:      envInt(b, "LOCKWARDEN_SCALE_CHURN", 100),
		samples:    envInt(b, "LOCKWARDEN_SCALE_HANDOVERS", 200),
		reconcile:  envInt(b, "LOCKWARDEN_SCALE_RECONCILERS", 0),
		podFilter:  envInt(b, "LOCKWARDEN_SCALE_POD_FILTER", 1) == 1,
		memLimit:   "192MiB",
		profiles:   os.Getenv("LOCKWARDEN_SCALE_PROFILES"),
		lease:      30 * time.Second, // the API's default, renewed every 10 s
	}
	if v, ok := os.LookupEnv("LOCKWARDEN_SCALE_GOMEMLIMIT"); ok {
		c.memLimit = v
	}
	if v := os.Getenv("LOCKWARDEN_SCALE_LEASE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("LOCKWARDEN_SCALE_LEASE: %v", err)
		}
		c.lease = d
	}
	if c.locks < 1 || c.namespaces < 1 || c.workers < 1 {
		b.Fatal("LOCKWARDEN_SCALE_LOCKS, _NAMESPACES and _WORKERS must be at least 1")
	}
	c.samples = min(c.samples, c.locks)
	return c
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		b.Fatalf("%s=%q: want a count", name, v)
	}
	return n
}

// BenchmarkManagerAtScale runs the manager binary, as a separate process,
// against envtest and redis-server with LOCKWARDEN_SCALE_LOCKS (default
// 10,000) DistributedLocks of 3 candidate pods each and LOCKWARDEN_SCALE_PODS
// (default 100,000) other pods, over LOCKWARDEN_SCALE_NAMESPACES (default
// 100) namespaces. The candidate pods carry candidateLabel, and the manager
// caches only them (--pod-label-selector) unless LOCKWARDEN_SCALE_POD_FILTER
// is 0. Its GOMEMLIMIT is LOCKWARDEN_SCALE_GOMEMLIMIT (default 192MiB, what
// it sets itself in a 256 MiB container; empty for none), and
// LOCKWARDEN_SCALE_PROFILES names a directory for its heap and CPU profiles.
// Run it with -benchtime 1x and a long -timeout. It reports:
//   - peak-rss-MiB: the manager's VmHWM; peak-heap-MiB: the most
//     go_memstats_heap_inuse_bytes seen, sampled every 500 ms;
//   - grant-all-s: from creating the locks (the manager's cache already
//     synced) until Redis shows every one held;
//   - handover-p50-ms, handover-p99-ms: from a holder pod's phase set to
//     Succeeded until Redis shows the next candidate holding, for a sample
//     of locks, while unrelated pods' labels change LOCKWARDEN_SCALE_CHURN
//     (default 100) times a second;
//   - steady-writes/min: the manager's own API writes (its
//     rest_client_requests_total for POST, PUT, PATCH and DELETE) while
//     every lock is held and the churn runs, over at least three renewal
//     intervals;
//   - grant-reconciles/s: controller_runtime_reconcile_total's rate while
//     granting.
func BenchmarkManagerAtScale(b *testing.B) {
	cfg := configFromEnv(b)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		b.Fatal(err)
	}
	bin := buildManager(b, root)
	for range b.N {
		runScale(b, root, bin, cfg)
	}
}

// buildManager builds the static manager binary as `make manager` does, or
// returns $LOCKWARDEN_SCALE_MANAGER, a manager binary built elsewhere (an
// older version, or one built with profiling).
func buildManager(b *testing.B, root string) string {
	if bin := os.Getenv("LOCKWARDEN_SCALE_MANAGER"); bin != "" {
		return bin
	}
	bin := filepath.Join(b.TempDir(), "manager")
	out, err := exec.Command("make", "-C", root, "--no-print-directory", "manager", "MANAGER_BIN="+bin, "VERSION=scale-bench").CombinedOutput()
	if err != nil {
		b.Fatalf("make manager: %v\n%s", err, out)
	}
	return bin
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s scale: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func runScale(b *testing.B, root, bin string, cfg config) {
	ctx := context.Background()
	progress("%d locks x %d candidates, %d other pods, %d namespaces, %d creators, lease %v",
		cfg.locks, candidatesPerLock, cfg.others, cfg.namespaces, cfg.workers, cfg.lease)

	// The control plane, with room in etcd for the pods.
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	var err error
	if env.BinaryAssetsDirectory, err = envtestassets.Dir(ctx, root, os.Stderr); err != nil {
		b.Fatal(err)
	}
	env.ControlPlane.Etcd = &envtest.Etcd{}
	env.ControlPlane.Etcd.Configure().Set("quota-backend-bytes", strconv.Itoa(8<<30))
	restCfg, err := env.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	restCfg.QPS, restCfg.Burst = -1, 0 // no client-side limit; the admin is exempt from APF
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, locksv1.AddToScheme} {
		if err := add(scheme); err != nil {
			b.Fatal(err)
		}
	}
	k8s, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		b.Fatal(err)
	}
	protoCfg := rest.CopyConfig(restCfg)
	protoCfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs := kubernetes.NewForConfigOrDie(protoCfg)

	srv, err := redistest.StartServer(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()

	// Namespaces, then every pod, before the manager starts: it starts on
	// a cluster that already has them, as after an install or a restart.
	setupStart := time.Now()
	nsName := func(i int) string { return fmt.Sprintf("scale-%03d", i%cfg.namespaces) }
	for i := range cfg.namespaces + 1 { // +1: the warm-up namespace
		name := fmt.Sprintf("scale-%03d", i)
		if i == cfg.namespaces {
			name = "scale-warmup"
		}
		// envtest runs without the ServiceAccount admission plugin, so
		// pods need no ServiceAccount.
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	var uidMu sync.Mutex
	candidateByUID := map[types.UID]types.NamespacedName{}
	total := cfg.locks*candidatesPerLock + cfg.others
	var created atomic.Int64
	parallel(b, cfg.workers, total, func(i int) error {
		var pod *corev1.Pod
		candidate := i < cfg.locks*candidatesPerLock
		if candidate {
			l := i / candidatesPerLock
			pod = newPod(nsName(l), fmt.Sprintf("%s-%d", lockName(l), i%candidatesPerLock), i, map[string]string{
				"app": lockName(l), "app.kubernetes.io/part-of": "scale-bench", "role": "singleton", candidateLabel: "true",
			})
		} else {
			o := i - cfg.locks*candidatesPerLock
			pod = newPod(nsName(o), fmt.Sprintf("web-%06d", o), i, map[string]string{
				"app": fmt.Sprintf("web-%d", o%50), "app.kubernetes.io/part-of": "scale-bench", "pod-template-hash": strconv.Itoa(o % 997),
			})
		}
		got, err := createRunning(ctx, cs, pod, i)
		if err != nil {
			return err
		}
		if candidate {
			uidMu.Lock()
			candidateByUID[got.UID] = types.NamespacedName{Namespace: got.Namespace, Name: got.Name}
			uidMu.Unlock()
		}
		if n := created.Add(1); n%20000 == 0 {
			progress("%d of %d pods created, %.0f/s", n, total, float64(n)/time.Since(setupStart).Seconds())
		}
		return nil
	})
	setup := time.Since(setupStart)
	progress("%d pods created and running in %v", total, setup.Round(time.Second))

	// The manager, as a separate process on a kubeconfig, with plain-HTTP
	// metrics.
	m := startManager(b, bin, restCfg, srv.Addr, cfg)
	defer m.stop(b)
	sampler := m.sample(500 * time.Millisecond)
	defer sampler.stop()

	// A warm-up lock: once it is held, the cache has synced and the
	// controller runs.
	syncStart := time.Now()
	warm := newLock("scale-warmup", "warmup", "warmup", cfg.lease)
	if err := k8s.Create(ctx, warm); err != nil {
		b.Fatal(err)
	}
	if _, err := createRunning(ctx, cs, newPod("scale-warmup", "warmup-0", 0, map[string]string{"app": "warmup", candidateLabel: "true"}), 0); err != nil {
		b.Fatal(err)
	}
	waitFor(b, 10*time.Minute, "the warm-up lock to be held", func() bool {
		n, err := rdb.Exists(ctx, "scale-warmup/warmup").Result()
		return err == nil && n == 1
	}, m)
	synced := time.Since(syncStart)
	afterSync := m.scrape(b)
	rssSync := m.rss()
	progress("manager synced and granting after %v: RSS %.0f MiB, heap in use %.0f MiB", synced.Round(time.Second), mib(rssSync), mib(afterSync.value("go_memstats_heap_inuse_bytes", nil)))

	// The locks, created concurrently; the clock runs until Redis shows
	// every one held.
	keys := make([]string, cfg.locks)
	for l := range cfg.locks {
		keys[l] = nsName(l) + "/" + lockName(l)
	}
	grantStart := time.Now()
	before := m.scrape(b)
	if cfg.profiles != "" {
		go m.profile("profile?seconds=30", filepath.Join(cfg.profiles, "cpu-granting.pprof"))
	}
	parallel(b, cfg.workers, cfg.locks, func(l int) error {
		return k8s.Create(ctx, newLock(nsName(l), lockName(l), lockName(l), cfg.lease))
	})
	progress("%d locks created in %v", cfg.locks, time.Since(grantStart).Round(time.Second))
	lastHeld := -1
	waitFor(b, 60*time.Minute, "every lock to be held", func() bool {
		held := countHeld(ctx, b, rdb, keys)
		if held != lastHeld {
			progress("%d of %d locks held after %v", held, cfg.locks, time.Since(grantStart).Round(time.Second))
			lastHeld = held
		}
		return held == cfg.locks
	}, m)
	grantAll := time.Since(grantStart)
	afterGrant := m.scrape(b)
	grantReconciles := afterGrant.reconciles() - before.reconciles()
	grantRate := grantReconciles / grantAll.Seconds()
	progress("all %d locks held after %v (%.0f reconciles, %.1f/s)", cfg.locks, grantAll.Round(time.Millisecond), grantReconciles, grantRate)

	// Let the grants' own writes (marks, statuses) and their events settle:
	// until the reconcile count stops moving for a few seconds.
	settleStart := time.Now()
	for last := afterGrant.reconciles(); ; {
		time.Sleep(3 * time.Second)
		now := m.scrape(b).reconciles()
		if now == last || time.Since(settleStart) > 5*time.Minute {
			break
		}
		last = now
	}
	progress("settled after %v", time.Since(settleStart).Round(time.Second))

	// Steady churn of unrelated pod events from here to the end.
	churn := startChurn(ctx, cs, cfg, nsName)
	defer churn.stop()

	// Steady holding: at least three renewal intervals, and 30 s.
	window := max(cfg.lease+cfg.lease/6, 30*time.Second)
	steadyStart := m.scrape(b)
	t0 := time.Now()
	time.Sleep(window)
	steadyEnd := m.scrape(b)
	elapsed := time.Since(t0)
	steadyWrites := steadyEnd.writes() - steadyStart.writes()
	writesPerMin := steadyWrites / elapsed.Minutes()
	steadyReconciles := (steadyEnd.reconciles() - steadyStart.reconciles()) / elapsed.Seconds()
	renewals := (steadyEnd.value("redislock_renewals_total", nil) - steadyStart.value("redislock_renewals_total", nil)) / elapsed.Seconds()
	if held := countHeld(ctx, b, rdb, keys); held != cfg.locks {
		b.Errorf("only %d of %d locks held after the steady window", held, cfg.locks)
	}
	progress("steady %v: %.0f writes, %.2f reconciles/s, %.0f renewals/s, churn %.0f/s", elapsed.Round(time.Second), steadyWrites, steadyReconciles, renewals, churn.rate())

	// Hand-overs, one at a time, for a sample spread over the locks.
	var handovers []time.Duration
	timeouts := 0
	for s := range cfg.samples {
		l := s * cfg.locks / cfg.samples
		d, err := handOver(ctx, rdb, cs, keys[l], candidateByUID)
		if err != nil {
			if errors.Is(err, errHandoverTimeout) {
				timeouts++
				handovers = append(handovers, d)
				continue
			}
			b.Fatalf("hand-over of %s: %v", keys[l], err)
		}
		handovers = append(handovers, d)
	}
	slices.Sort(handovers)
	const rssTarget, handoverTarget = 256 << 20, time.Second
	p50 := handovers[len(handovers)/2]
	p99 := handovers[min(len(handovers)-1, len(handovers)*99/100)]
	p90 := handovers[len(handovers)*9/10]
	over := 0
	for _, d := range handovers {
		if d >= handoverTarget {
			over++
		}
	}
	churnRate := churn.rate()
	churn.stop()
	progress("hand-overs: p50 %v, p90 %v, p99 %v, max %v, %d over %v, %d timeouts", p50, p90, p99, handovers[len(handovers)-1], over, handoverTarget, timeouts)

	final := m.scrape(b)
	if cfg.profiles != "" {
		m.profile("heap", filepath.Join(cfg.profiles, "heap-held.pprof"))
	}
	sampler.stop()
	peakRSS := m.hwm(b)
	peakHeap := sampler.maxHeap.Load()
	rssHeld := sampler.lastRSS.Load()

	b.ReportMetric(mib(float64(peakRSS)), "peak-rss-MiB")
	b.ReportMetric(mib(float64(peakHeap)), "peak-heap-MiB")
	b.ReportMetric(grantAll.Seconds(), "grant-all-s")
	b.ReportMetric(float64(p50.Microseconds())/1000, "handover-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "handover-p99-ms")
	b.ReportMetric(writesPerMin, "steady-writes/min")
	b.ReportMetric(grantRate, "grant-reconciles/s")

	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**not met**"
	}
	var t strings.Builder
	filter := "every pod cached"
	if cfg.podFilter {
		filter = "--pod-label-selector=" + candidateLabel + "=true"
	}
	fmt.Fprintf(&t, "\n| %d locks x %d candidates + %d other pods, %d namespaces; %s; GOMEMLIMIT %q | measured | target | |\n|---|---|---|---|\n",
		cfg.locks, candidatesPerLock, cfg.others, cfg.namespaces, filter, cfg.memLimit)
	fmt.Fprintf(&t, "| manager peak RSS (VmHWM) | %.0f MiB | < 256 MiB | %s (%.2f × target) |\n", mib(float64(peakRSS)), met(peakRSS < rssTarget), float64(peakRSS)/rssTarget)
	fmt.Fprintf(&t, "| manager peak Go heap in use | %.0f MiB | | |\n", mib(float64(peakHeap)))
	fmt.Fprintf(&t, "| RSS / heap after cache sync, no locks yet | %.0f / %.0f MiB | | |\n", mib(rssSync), mib(afterSync.value("go_memstats_heap_inuse_bytes", nil)))
	fmt.Fprintf(&t, "| RSS / heap with every lock held, churn running | %.0f / %.0f MiB | | |\n", mib(float64(rssHeld)), mib(final.value("go_memstats_heap_inuse_bytes", nil)))
	fmt.Fprintf(&t, "| grant all locks | %v (%.0f reconciles, %.1f/s) | | |\n", grantAll.Round(100*time.Millisecond), grantReconciles, grantRate)
	fmt.Fprintf(&t, "| hand-over p50 / p90 / p99 / max (%d locks, %d over 1 s; churn %.0f pod updates/s) | %v / %v / %v / %v | p99 < 1 s | %s (%.2f × target) |\n",
		len(handovers), over, churnRate, p50.Round(100*time.Microsecond), p90.Round(100*time.Microsecond), p99.Round(100*time.Microsecond), handovers[len(handovers)-1].Round(100*time.Microsecond),
		met(p99 < handoverTarget && timeouts == 0), float64(p99)/float64(handoverTarget))
	fmt.Fprintf(&t, "| API writes per minute, holding steadily (%v, lease %v) | %.0f | 0 | %s |\n", elapsed.Round(time.Second), cfg.lease, writesPerMin, met(steadyWrites == 0))
	fmt.Fprintf(&t, "| reconciles/s: granting / holding steadily | %.1f / %.2f | | |\n", grantRate, steadyReconciles)
	fmt.Fprintf(&t, "| Redis renewals/s, holding steadily | %.0f | | |\n", renewals)
	fmt.Fprintf(&t, "| setup: pods created and set Running / manager start to first grant | %v / %v | | |\n", setup.Round(time.Second), synced.Round(time.Second))
	// Printed, not logged: the testing package cuts a benchmark's log short.
	fmt.Print(t.String())
}

func lockName(l int) string { return fmt.Sprintf("lock-%05d", l) }

func mib(bytes float64) float64 { return bytes / (1 << 20) }

// parallel runs f(0..n-1) on workers goroutines and fails on the first
// error.
func parallel(b *testing.B, workers, n int, f func(i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { firstErr = err })
					next.Store(int64(n))
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
}

// newPod is a pod as a Deployment's would be, bound to a node.
func newPod(ns, name string, i int, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName: fmt.Sprintf("node-%03d", i%200),
			Containers: []corev1.Container{{
				Name:  "main",
				Image: "registry.example/team/app:v1.2.3",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi"),
				}},
			}},
		},
	}
}

// createRunning creates the pod and sets its status as a kubelet would for
// a running pod. No kubelet runs.
func createRunning(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, i int) (*corev1.Pod, error) {
	got, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	now := metav1.Now()
	cond := func(t corev1.PodConditionType) corev1.PodCondition {
		return corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now}
	}
	got.Status = corev1.PodStatus{
		Phase:      corev1.PodRunning,
		Conditions: []corev1.PodCondition{cond(corev1.PodInitialized), cond(corev1.PodReady), cond(corev1.ContainersReady), cond(corev1.PodScheduled)},
		HostIP:     fmt.Sprintf("10.0.%d.%d", i%200/100, i%100+1),
		PodIP:      fmt.Sprintf("10.%d.%d.%d", 1+i>>16&0xff, i>>8&0xff, i&0xff),
		StartTime:  &now,
		QOSClass:   corev1.PodQOSBurstable,
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "main", Image: "registry.example/team/app:v1.2.3", ImageID: "registry.example/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			ContainerID: fmt.Sprintf("containerd://%064x", i), Ready: true, Started: new(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	return cs.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{})
}

func newLock(ns, name, app string, lease time.Duration) *locksv1.DistributedLock {
	return &locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: locksv1.DistributedLockSpec{
			LeaseDuration: &metav1.Duration{Duration: lease},
			Candidates:    &locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"app": locksv1.LabelValue(app)}},
		},
	}
}

// countHeld counts the keys Redis holds (a held lock is a hash of owners).
func countHeld(ctx context.Context, b *testing.B, rdb *redis.Client, keys []string) int {
	held := 0
	for chunk := range slices.Chunk(keys, 1000) {
		pipe := rdb.Pipeline()
		cmds := make([]*redis.IntCmd, len(chunk))
		for i, k := range chunk {
			cmds[i] = pipe.Exists(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		for _, c := range cmds {
			held += int(c.Val())
		}
	}
	return held
}

var errHandoverTimeout = errors.New("not handed over within 20 s")

// handOver ends the pod holding key (phase Succeeded) and times until Redis
// shows another owner holding it.
func handOver(ctx context.Context, rdb *redis.Client, cs kubernetes.Interface, key string, byUID map[types.UID]types.NamespacedName) (time.Duration, error) {
	owners, err := rdb.HKeys(ctx, key).Result()
	if err != nil {
		return 0, err
	}
	if len(owners) != 1 {
		return 0, fmt.Errorf("owners %v, want one", owners)
	}
	old := owners[0]
	pod, ok := byUID[types.UID(strings.TrimSuffix(old, ":0"))]
	if !ok {
		return 0, fmt.Errorf("owner %s is no candidate pod", old)
	}
	start := time.Now()
	if _, err := cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType,
		[]byte(`{"status":{"phase":"Succeeded"}}`), metav1.PatchOptions{}, "status"); err != nil {
		return 0, err
	}
	for {
		owners, err := rdb.HKeys(ctx, key).Result()
		if err != nil {
			return 0, err
		}
		if len(owners) == 1 && owners[0] != old {
			return time.Since(start), nil
		}
		if time.Since(start) > 20*time.Second {
			return time.Since(start), errHandoverTimeout
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// churner updates unrelated pods' labels at a steady rate.
type churner struct {
	cancel  context.CancelFunc
	done    chan struct{}
	start   time.Time
	updates atomic.Int64
	once    sync.Once
	elapsed time.Duration
}

func startChurn(ctx context.Context, cs kubernetes.Interface, cfg config, nsName func(int) string) *churner {
	ctx, cancel := context.WithCancel(ctx)
	c := &churner{cancel: cancel, done: make(chan struct{}), start: time.Now()}
	if cfg.churn == 0 || cfg.others == 0 {
		close(c.done)
		return c
	}
	ticks := make(chan int)
	var wg sync.WaitGroup
	for range 8 { // enough to keep the rate on a loaded machine
		wg.Go(func() {
			for o := range ticks {
				patch := fmt.Sprintf(`{"metadata":{"labels":{"churn":"%d"}}}`, o)
				if _, err := cs.CoreV1().Pods(nsName(o%cfg.others)).Patch(ctx, fmt.Sprintf("web-%06d", o%cfg.others),
					types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err == nil {
					c.updates.Add(1)
				}
			}
		})
	}
	go func() {
		defer close(c.done)
		defer wg.Wait()
		defer close(ticks)
		t := time.NewTicker(time.Second / time.Duration(cfg.churn))
		defer t.Stop()
		for o := 0; ; o += 7919 { // a prime stride spreads the updates over namespaces
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				select {
				case ticks <- o:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return c
}

func (c *churner) rate() float64 {
	d := c.elapsed
	if d == 0 {
		d = time.Since(c.start)
	}
	return float64(c.updates.Load()) / d.Seconds()
}

func (c *churner) stop() {
	c.once.Do(func() {
		c.elapsed = time.Since(c.start)
		c.cancel()
		<-c.done
	})
}

// manager is the manager binary running as a separate process.
type manager struct {
	cmd     *exec.Cmd
	done    chan struct{}
	log     string
	metrics string
	pprof   string // the pprof address, if profiling
	http    *http.Client
}

// profile writes the manager's /debug/pprof/<what> to file.
func (m *manager) profile(what, file string) {
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Get("http://" + m.pprof + "/debug/pprof/" + what)
	if err != nil {
		progress("profile %s: %v", what, err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err == nil {
		err = os.WriteFile(file, data, 0o644)
	}
	if err != nil {
		progress("profile %s: %v", what, err)
		return
	}
	progress("wrote %s", file)
}

func startManager(b *testing.B, bin string, restCfg *rest.Config, redisAddr string, cfg config) *manager {
	dir := b.TempDir()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: restCfg.Host, CertificateAuthorityData: restCfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: restCfg.CertData, ClientKeyData: restCfg.KeyData}
	kc.Contexts["admin"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "admin"
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		b.Fatal(err)
	}
	m := &manager{done: make(chan struct{}), log: filepath.Join(dir, "manager.log"), metrics: freeAddr(b),
		http: &http.Client{Timeout: 10 * time.Second}}
	args := []string{"--kubeconfig=" + kubeconfig, "--metrics-bind-address=" + m.metrics, "--metrics-secure=false",
		"--health-probe-bind-address=" + freeAddr(b)}
	if cfg.podFilter {
		args = append(args, "--pod-label-selector="+candidateLabel+"=true")
	}
	if cfg.profiles != "" {
		m.pprof = freeAddr(b)
		args = append(args, "--pprof-bind-address="+m.pprof)
	}
	if cfg.reconcile > 0 {
		args = append(args, fmt.Sprintf("--max-concurrent-reconciles=%d", cfg.reconcile))
	}
	out, err := os.Create(m.log)
	if err != nil {
		b.Fatal(err)
	}
	m.cmd = exec.Command(bin, args...)
	m.cmd.Env = []string{"HOME=" + dir, "REDIS_URL=redis://" + redisAddr + "/0"}
	if cfg.memLimit != "" {
		m.cmd.Env = append(m.cmd.Env, "GOMEMLIMIT="+cfg.memLimit)
	}
	m.cmd.Stdout, m.cmd.Stderr = out, out
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() { _ = m.cmd.Wait(); _ = out.Close(); close(m.done) }()
	waitFor(b, time.Minute, "the manager's metrics endpoint", func() bool {
		_, err := m.get()
		return err == nil
	}, m)
	return m
}

// stop sends SIGTERM, as the kubelet would, and shows the log's tail if the
// benchmark failed.
func (m *manager) stop(b *testing.B) {
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(40 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.done
	}
	if b.Failed() {
		b.Logf("manager log tail:\n%s", m.logTail())
	}
}

func (m *manager) exited() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

func (m *manager) logTail() string {
	data, _ := os.ReadFile(m.log)
	if len(data) > 8000 {
		data = data[len(data)-8000:]
	}
	return string(data)
}

func (m *manager) get() (string, error) {
	resp, err := m.http.Get("http://" + m.metrics + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("/metrics: HTTP %d", resp.StatusCode)
	}
	return string(body), nil
}

func (m *manager) scrape(b *testing.B) metrics {
	body, err := m.get()
	if err != nil {
		b.Fatalf("scrape: %v\n%s", err, m.logTail())
	}
	return parseMetrics(body)
}

// procStatus reads a field of /proc/<pid>/status, in bytes.
func (m *manager) procStatus(field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", m.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, m.cmd.Process.Pid)
}

func (m *manager) rss() float64 {
	v, _ := m.procStatus("VmRSS")
	return float64(v)
}

func (m *manager) hwm(b *testing.B) int64 {
	v, err := m.procStatus("VmHWM")
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// sampler records the manager's heap in use, at most, and its RSS, last.
type sampler struct {
	maxHeap atomic.Int64
	lastRSS atomic.Int64
	cancel  chan struct{}
	done    chan struct{}
	once    sync.Once
}

func (m *manager) sample(every time.Duration) *sampler {
	s := &sampler{cancel: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if body, err := m.get(); err == nil {
				if h := int64(parseMetrics(body).value("go_memstats_heap_inuse_bytes", nil)); h > s.maxHeap.Load() {
					s.maxHeap.Store(h)
				}
			}
			if v, err := m.procStatus("VmRSS"); err == nil {
				s.lastRSS.Store(v)
			}
			select {
			case <-s.cancel:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) stop() {
	s.once.Do(func() { close(s.cancel); <-s.done })
}

// metrics are the samples of one scrape: a name with its labels, and a value.
type metrics []sample

type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics reads Prometheus's text format, enough for counters and
// gauges with simple label values.
func parseMetrics(body string) metrics {
	var out metrics
	for line := range strings.SplitSeq(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		s := sample{name: line[:sp], labels: map[string]string{}, value: v}
		if i := strings.IndexByte(s.name, '{'); i >= 0 {
			for kv := range strings.SplitSeq(strings.TrimSuffix(s.name[i+1:], "}"), ",") {
				if k, val, ok := strings.Cut(kv, "="); ok {
					s.labels[k] = strings.Trim(val, `"`)
				}
			}
			s.name = s.name[:i]
		}
		out = append(out, s)
	}
	return out
}

// value sums the samples of the metric whose labels pass keep (nil: all).
func (ms metrics) value(name string, keep func(map[string]string) bool) float64 {
	sum := 0.0
	for _, s := range ms {
		if s.name == name && (keep == nil || keep(s.labels)) {
			sum += s.value
		}
	}
	return sum
}

// writes are the manager's API requests that write.
func (ms metrics) writes() float64 {
	return ms.value("rest_client_requests_total", func(l map[string]string) bool {
		switch l["method"] {
		case "POST", "PUT", "PATCH", "DELETE":
			return true
		}
		return false
	})
}

func (ms metrics) reconciles() float64 {
	return ms.value("controller_runtime_reconcile_total", func(l map[string]string) bool { return l["controller"] == "distributedlock" })
}

// waitFor polls cond until it holds, failing after limit or if the manager
// exits.
func waitFor(b *testing.B, limit time.Duration, what string, cond func() bool, m *manager) {
	deadline := time.Now().Add(limit)
	for !cond() {
		if m != nil && m.exited() {
			b.Fatalf("the manager exited while waiting for %s:\n%s", what, m.logTail())
		}
		if time.Now().After(deadline) {
			b.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
