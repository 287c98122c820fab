// The randomized fault run: two manager replicas electing a leader, guarded
// Jobs and a leader-election Deployment on four keys (one shared by two
// namespaces), under faults of the manager, Redis and the API server and
// the disruptions of ordinary operations. It is judged from kwok's run
// stamps and the pods' marks alone.

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
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
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/plane"
	"github.com/lockwarden/lockwarden/internal/redistest"
)

// The fault run's knobs, from the environment: make test runs the
// defaults, make fault a longer run.
const (
	// faultSeedEnv replays a run: the same seed makes the same choices
	// (what to create, which fault, how long), though the processes'
	// timing differs from run to run.
	faultSeedEnv = "LOCKWARDEN_FAULT_SEED"
	// faultDurationEnv is how long faults are injected, as a Go duration.
	faultDurationEnv = "LOCKWARDEN_FAULT_DURATION"
)

const (
	defaultFaultDuration = 2 * time.Minute
	// faultRecovery bounds the wait, once the faults stop and everything
	// is restored, for every Job to finish.
	faultRecovery = 3 * time.Minute
	// faultBacklog is how many unfinished Jobs the run keeps at most.
	faultBacklog = 6
	// The managers' election and the locks' lease meet the failover inequality of
	// docs/concepts-and-guarantees.md: 4s + 0.5s + start-up < 12s - 4s.
	faultElectionLease = 4 * time.Second
	faultLockLease     = 12 * time.Second
	// faultLeaseNamespace holds the managers' leader-election Lease.
	faultLeaseNamespace = "lockwarden-system"
	faultLeaseName      = "lockwarden-manager.lockwarden.dev"
	faultSharedKey      = "fault/shared"
)

// TestFaultRun injects random faults for LOCKWARDEN_FAULT_DURATION (2m by
// default) into a plane where two manager replicas (--leader-elect, a key
// shared by two namespaces with --shared-key) guard Jobs, some behind two
// locks, and a Deployment electing a leader:
//   - the leading manager killed (SIGKILL) and restarted, or paused
//     (SIGSTOP) for up to 8s, sometimes with Redis restarted empty during
//     the pause; or paused the moment it takes a key in Redis for a pod
//     (mid-grant, caught by Redis keyspace notifications) for longer than
//     the election lease, while Redis restarts empty and the lock's
//     selector is edited to leave that pod out (issue 20, case 10);
//   - Redis restarted empty, or paused; the API server paused;
//   - meanwhile: guarded pods evicted and deleted with grace, lock
//     selectors edited, locks deleted and created again.
//
// Then the faults stop, everything is restored (processes resumed and
// running, locks back with their first selectors), and every Job must
// finish within 3 minutes. The checker counts, from kwok's run stamps and
// the pods' marks only: overlapping runs of the pods of a key, fencing
// tokens that fail to rise from one holder to the next, and Jobs that
// never finished.
func TestFaultRun(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(faultSeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", faultSeedEnv, s, err)
		}
	}
	duration := defaultFaultDuration
	if s := os.Getenv(faultDurationEnv); s != "" {
		var err error
		if duration, err = time.ParseDuration(s); err != nil {
			t.Fatalf("%s=%q: %v", faultDurationEnv, s, err)
		}
	}
	t.Logf("fault run: seed %d (replay with %s=%d), faults for %v", seed, faultSeedEnv, seed, duration)
	defer func() {
		if t.Failed() {
			t.Logf("fault run failed: replay with %s=%d %s=%v", faultSeedEnv, seed, faultDurationEnv, duration)
		}
	}()

	f := startFaultRun(t, seed)
	f.run(duration)
	f.recover()
	f.check()
}

// faultRun is the fault run's world.
type faultRun struct {
	t         *testing.T
	seed      uint64
	cs        *kubernetes.Clientset
	k8s       client.Client
	dir       string
	nsA, nsB  string
	redis     *redistest.Server
	rdb       *redis.Client
	replicas  []*replica
	apiserver int // kube-apiserver's process ID

	leader atomic.Int32 // index of the replica holding the Lease; -1 unknown

	// armed, while set, makes the next grant in Redis pause the leader
	// (pauseLeaderMidGrant); midGrant receives what it caught.
	armed    atomic.Bool
	midGrant chan midGrantHit

	// restarts are the restarts of replicas that exited by themselves.
	restarts sync.WaitGroup

	mu sync.Mutex
	// stopping is set at the end, when replicas that exit stay down.
	stopping bool
	counts   map[string]int
	pending  sync.WaitGroup // lock re-creations in flight
	deleting map[lockRef]bool
	apiPause sync.Mutex // held while the API server is paused
	redisMu  sync.Mutex // serialises Redis restarts and pauses
	log      *os.File
}

// faultLock is one of the run's locks.
type faultLock struct {
	ref lockRef
	key string
}

func (f *faultRun) locks() []faultLock {
	return []faultLock{
		{lockRef{f.nsA, "shared"}, faultSharedKey},
		{lockRef{f.nsB, "shared"}, faultSharedKey},
		{lockRef{f.nsA, "solo"}, f.nsA + "/solo"},
		{lockRef{f.nsB, "second"}, f.nsB + "/second"},
		{lockRef{f.nsB, "leader"}, f.nsB + "/leader"},
	}
}

func (f *faultRun) keys() []string {
	return []string{faultSharedKey, f.nsA + "/solo", f.nsB + "/second", f.nsB + "/leader"}
}

type midGrantHit struct {
	key     string
	replica int
	owner   string // the owner field the grant wrote, "<pod UID>:0"
}

func (f *faultRun) logf(format string, args ...any) {
	line := fmt.Sprintf("%s "+format, append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	f.t.Log(line)
	f.mu.Lock()
	defer f.mu.Unlock()
	fmt.Fprintln(f.log, line)
}

func (f *faultRun) count(what string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts[what]++
}

// startFaultRun stops the shared manager (the two replicas take its place
// for the run, and it comes back at the end), starts a Redis of the run's
// own, the namespaces, locks and the Deployment, and the two replicas.
func startFaultRun(t *testing.T, seed uint64) *faultRun {
	ctx := context.Background()
	cfg := rest.CopyConfig(pl.Config)
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &faultRun{
		t: t, seed: seed, cs: cs, k8s: k8s, dir: t.TempDir(),
		counts: map[string]int{}, deleting: map[lockRef]bool{},
		midGrant: make(chan midGrantHit, 1),
	}
	f.leader.Store(-1)
	if f.log, err = os.Create(filepath.Join(f.dir, "faults.log")); err != nil {
		t.Fatal(err)
	}
	for _, p := range pl.Processes() {
		if p.Name == "kube-apiserver" {
			f.apiserver = p.PID
		}
	}
	if f.apiserver == 0 {
		t.Fatal("no kube-apiserver process ID")
	}

	mgr.stop()
	t.Cleanup(func() {
		if err := mgr.start(context.Background()); err != nil {
			t.Errorf("restarting the shared manager: %v", err)
		}
	})
	if f.redis, err = redistest.StartServer(f.dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.redis.Stop)
	f.rdb = redis.NewClient(&redis.Options{Addr: f.redis.Addr, MaxRetries: -1})
	t.Cleanup(func() { f.rdb.Close() })
	f.notifyGrants()

	f.nsA, f.nsB = newNamespace(t), newNamespace(t)
	for _, l := range f.locks() {
		declareLock(l.ref.namespace, l.ref.name, l.key)
		f.createLock(l)
	}
	for _, key := range f.keys() {
		guardKey(t, key)
	}

	// The replicas act as the manager's user, with config/rbac's
	// leader-election Role bound in their namespace.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: faultLeaseNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	role := readRole(t, filepath.Join("..", "..", "config", "rbac", "leader_election_role.yaml"))
	role.Namespace = faultLeaseNamespace
	if _, err := cs.RbacV1().Roles(faultLeaseNamespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: faultLeaseNamespace, Name: "lockwarden-manager-leader-election"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "lockwarden-manager"}},
	}
	if _, err := cs.RbacV1().RoleBindings(faultLeaseNamespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for i := range 2 {
		r := &replica{
			idx: i, bin: mgr.bin, kubeconfig: mgr.kubeconfig, redisURL: "redis://" + f.redis.Addr,
			log:            filepath.Join(f.dir, fmt.Sprintf("manager-%d.log", i)),
			exitedByItself: f.restartExited,
			args: []string{
				"--leader-elect",
				"--leader-elect-lease-duration=" + faultElectionLease.String(),
				"--leader-elect-renew-deadline=3s",
				"--leader-elect-retry-period=500ms",
				"--shared-key=" + faultSharedKey + "=" + f.nsA + "," + f.nsB,
			},
		}
		f.replicas = append(f.replicas, r)
		if err := r.start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		f.mu.Lock()
		f.stopping = true
		f.mu.Unlock()
		f.restarts.Wait()
		for _, r := range f.replicas {
			r.stop()
		}
		if t.Failed() {
			for _, r := range f.replicas {
				t.Logf("replica %d's log (last lines):\n%s", r.idx, tailFile(r.log, 80))
			}
		}
	})
	f.watchLeader()

	// A Deployment electing a leader among its two pods: the leader's
	// container fails, succeeds and fails again, each time restarted in
	// place, then runs on.
	tpl := f.template(f.nsB, []string{"leader"}, corev1.RestartPolicyAlways, "1,0,1", 2*time.Second, "x")
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "elector", Namespace: f.nsB},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"fault.lockwarden.dev/elector": "yes"}},
			Template: tpl,
		},
	}
	deploy.Spec.Template.Labels["fault.lockwarden.dev/elector"] = "yes"
	deploy.Spec.Template.Labels["app"] = "elector"
	if _, err := cs.AppsV1().Deployments(f.nsB).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Its pods would run on for ever; the replicas still run when this
	// cleanup does.
	t.Cleanup(func() {
		background := metav1.DeletePropagationBackground
		_ = cs.AppsV1().Deployments(f.nsB).Delete(context.Background(), deploy.Name, metav1.DeleteOptions{PropagationPolicy: &background})
	})
	return f
}

func readRole(t *testing.T, file string) *rbacv1.Role {
	t.Helper()
	role := &rbacv1.Role{}
	decodeFile(t, file, role)
	if role.Name == "" || len(role.Rules) == 0 {
		t.Fatalf("%s: no Role", file)
	}
	return role
}

// allPods is the candidates selector every lock starts with and returns
// to: the Jobs' pods, app=fault, for the Jobs' locks, and the Deployment's,
// app=elector, for its lock. A running pod a lock selects but does not gate
// is a candidate too (leader election), so the two must not mix: an
// elector would hold a Job lock's key for ever.
func allPods(ref lockRef) locksv1.PodSelector {
	app := "fault"
	if ref.name == "leader" {
		app = "elector"
	}
	return locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"app": locksv1.LabelValue(app)}}
}

func (f *faultRun) createLock(l faultLock) {
	lock := &locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: l.ref.namespace, Name: l.ref.name},
		Spec: locksv1.DistributedLockSpec{
			Key:           l.key,
			LeaseDuration: &metav1.Duration{Duration: faultLockLease},
			Candidates:    ptr.To(allPods(l.ref)),
		},
	}
	if l.key == l.ref.namespace+"/"+l.ref.name {
		lock.Spec.Key = "" // the default
	}
	if err := f.k8s.Create(context.Background(), lock); err != nil {
		f.t.Errorf("create lock %s/%s: %v", l.ref.namespace, l.ref.name, err)
	}
}

// template is a pod template in ns behind the gates of locks, labelled
// as a Job's pod (app: fault) with a variant that selector edits pick
// between.
func (f *faultRun) template(ns string, locks []string, policy corev1.RestartPolicy, codes string, runFor time.Duration, variant string) corev1.PodTemplateSpec {
	tpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{"app": "fault", "variant": variant},
			Annotations: map[string]string{
				plane.CompleteDelayAnnotation: runFor.String(),
				plane.ExitCodesAnnotation:     codes,
				plane.BackoffAnnotation:       "500ms",
			},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 policy,
			TerminationGracePeriodSeconds: ptr.To[int64](2),
			Containers:                    []corev1.Container{{Name: "work", Image: "busybox"}},
		},
	}
	for _, l := range locks {
		tpl.Spec.SchedulingGates = append(tpl.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: locksv1.GateFor(l)})
	}
	return tpl
}

// run injects faults for d, while the workload and the disruptions of
// ordinary operations go on beside them.
func (f *faultRun) run(d time.Duration) {
	deadline := time.Now().Add(d)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { f.operate(rand.New(rand.NewPCG(f.seed, 2)), stop) })
	rng := rand.New(rand.NewPCG(f.seed, 1))
	faults := []struct {
		name   string
		weight int
		run    func(*rand.Rand)
	}{
		{"kill-leader", 2, f.killLeader},
		{"pause-leader", 2, f.pauseLeader},
		{"pause-leader-mid-grant", 3, f.pauseLeaderMidGrant},
		{"restart-redis", 1, func(*rand.Rand) { f.restartRedis() }},
		{"pause-redis", 1, f.pauseRedis},
		{"pause-apiserver", 1, f.pauseAPIServer},
	}
	total := 0
	for _, fault := range faults {
		total += fault.weight
	}
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(500+rng.IntN(2500)) * time.Millisecond)
		n := rng.IntN(total)
		for _, fault := range faults {
			if n -= fault.weight; n < 0 {
				f.count(fault.name)
				fault.run(rng)
				break
			}
		}
	}
	close(stop)
	wg.Wait()
}

// operate is the workload and the cluster's ordinary disruptions: it
// creates guarded Jobs (up to faultBacklog unfinished), evicts and deletes
// running guarded pods, edits lock selectors, and deletes locks and
// creates them again.
func (f *faultRun) operate(rng *rand.Rand, stop <-chan struct{}) {
	jobs := 0
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(300+rng.IntN(1200)) * time.Millisecond):
		}
		switch n := rng.IntN(10); {
		case n < 6:
			if f.unfinishedJobs() < faultBacklog {
				jobs++
				f.createJob(rng, fmt.Sprintf("job-%03d", jobs))
			}
		case n == 6:
			f.disruptPod(rng, true)
		case n == 7:
			f.disruptPod(rng, false)
		case n == 8:
			f.editSelector(rng)
		default:
			f.recreateLock(rng)
		}
	}
}

func (f *faultRun) unfinishedJobs() int {
	n := 0
	for _, ns := range []string{f.nsA, f.nsB} {
		list, err := f.cs.BatchV1().Jobs(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return faultBacklog // create nothing while the API server is away
		}
		for i := range list.Items {
			if !finished(&list.Items[i]) {
				n++
			}
		}
	}
	return n
}

// createJob creates a guarded Job of random shape: one or two locks, a
// restart policy and exits that make the kubelet restart it in place or
// fail it, sometimes an init container and a native sidecar, sometimes a
// quick exit on SIGTERM.
func (f *faultRun) createJob(rng *rand.Rand, name string) {
	ns, locks := f.nsA, [][]string{{"shared"}, {"solo"}, {"shared", "solo"}}
	if rng.IntN(2) == 1 {
		ns, locks = f.nsB, [][]string{{"shared"}, {"second"}, {"shared", "second"}}
	}
	policy, codes := corev1.RestartPolicyNever, []string{"0", "0", "0", "1"}[rng.IntN(4)]
	if rng.IntN(2) == 1 {
		policy, codes = corev1.RestartPolicyOnFailure, []string{"0", "1,0", "1,1,0"}[rng.IntN(3)]
	}
	runFor := time.Duration(300+rng.IntN(1200)) * time.Millisecond
	tpl := f.template(ns, locks[rng.IntN(len(locks))], policy, codes, runFor, []string{"x", "y"}[rng.IntN(2)])
	if rng.IntN(3) == 0 {
		tpl.Annotations[plane.InitDelayAnnotation] = "200ms"
		tpl.Annotations[plane.SidecarStopDelayAnnotation] = fmt.Sprintf("%dms", rng.IntN(1000))
		tpl.Spec.InitContainers = []corev1.Container{
			{Name: "fetch", Image: "busybox"},
			{Name: "proxy", Image: "busybox", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)},
		}
	}
	if rng.IntN(2) == 0 {
		tpl.Annotations[plane.StopDelayAnnotation] = fmt.Sprintf("%dms", 100+rng.IntN(900))
	}
	// A failed pod is retried after 10s, 20s, 40s...: few retries, or a
	// failing Job would outlast the run. Under OnFailure the restarts
	// count against the limit, and the Job ends Failed when they reach it.
	limit := int32(1)
	if policy == corev1.RestartPolicyOnFailure {
		limit = 3
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       batchv1.JobSpec{BackoffLimit: ptr.To(limit), Template: tpl},
	}
	if _, err := f.cs.BatchV1().Jobs(ns).Create(context.Background(), job, metav1.CreateOptions{}); err != nil {
		f.logf("create Job %s/%s: %v", ns, name, err)
		return
	}
	f.count("job")
	f.logf("Job %s/%s: gates %v, %s, exits %s after %v, sidecar %v", ns, name, tpl.Spec.SchedulingGates, policy, codes, runFor, len(tpl.Spec.InitContainers) > 0)
}

// disruptPod evicts a running guarded pod, or deletes it with a grace
// period of 1-3s.
func (f *faultRun) disruptPod(rng *rand.Rand, evict bool) {
	var running []corev1.Pod
	for _, ns := range []string{f.nsA, f.nsB} {
		list, err := f.cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return
		}
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running = append(running, p)
			}
		}
	}
	if len(running) == 0 {
		return
	}
	pod := running[rng.IntN(len(running))]
	if evict {
		err := f.cs.CoreV1().Pods(pod.Namespace).EvictV1(context.Background(), &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}})
		f.count("evict")
		f.logf("evict %s/%s: %v", pod.Namespace, pod.Name, err)
		return
	}
	grace := int64(1 + rng.IntN(3))
	err := f.cs.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	f.count("delete-pod")
	f.logf("delete %s/%s with grace %ds: %v", pod.Namespace, pod.Name, grace, err)
}

// editSelector sets a lock's candidates to every pod, or to one variant.
func (f *faultRun) editSelector(rng *rand.Rand) {
	locks := f.locks()
	l := locks[rng.IntN(len(locks))]
	sel := allPods(l.ref)
	if v := []string{"", "x", "y"}[rng.IntN(3)]; v != "" {
		sel.MatchLabels["variant"] = locksv1.LabelValue(v)
	}
	f.setSelector(l.ref, sel)
}

func (f *faultRun) setSelector(ref lockRef, sel locksv1.PodSelector) {
	lock := &locksv1.DistributedLock{}
	ctx := context.Background()
	if err := f.k8s.Get(ctx, client.ObjectKey{Namespace: ref.namespace, Name: ref.name}, lock); err != nil {
		f.logf("edit the selector of %s/%s: %v", ref.namespace, ref.name, err)
		return
	}
	before := lock.DeepCopy()
	lock.Spec.Candidates = &sel
	err := f.k8s.Patch(ctx, lock, client.MergeFrom(before))
	f.count("edit-selector")
	f.logf("selector of %s/%s: %v: %v", ref.namespace, ref.name, sel.MatchLabels, err)
}

// recreateLock deletes a lock (not the Deployment's: its finalizer waits
// for a leader that never stops) and creates it again 0-3s after it is
// gone.
func (f *faultRun) recreateLock(rng *rand.Rand) {
	locks := f.locks()[:4]
	l := locks[rng.IntN(len(locks))]
	f.mu.Lock()
	if f.deleting[l.ref] {
		f.mu.Unlock()
		return
	}
	f.deleting[l.ref] = true
	f.mu.Unlock()
	ctx := context.Background()
	lock := &locksv1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: l.ref.namespace, Name: l.ref.name}}
	err := f.k8s.Delete(ctx, lock)
	f.count("recreate-lock")
	f.logf("delete lock %s/%s: %v", l.ref.namespace, l.ref.name, err)
	delay := time.Duration(rng.IntN(3000)) * time.Millisecond
	f.pending.Go(func() {
		defer func() {
			f.mu.Lock()
			delete(f.deleting, l.ref)
			f.mu.Unlock()
		}()
		// Its finalizer waits for every pod it ungated to stop.
		deadline := time.Now().Add(faultRecovery)
		for {
			err := f.k8s.Get(ctx, client.ObjectKey{Namespace: l.ref.namespace, Name: l.ref.name}, &locksv1.DistributedLock{})
			if apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				f.t.Errorf("lock %s/%s not gone %v after its deletion", l.ref.namespace, l.ref.name, faultRecovery)
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		time.Sleep(delay)
		f.createLock(l)
		f.logf("lock %s/%s created again", l.ref.namespace, l.ref.name)
	})
}

// watchLeader follows the Lease: its holder identity starts with the
// replica's host name, replica-<i>.
func (f *faultRun) watchLeader() {
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			lease, err := f.cs.CoordinationV1().Leases(faultLeaseNamespace).Get(ctx, faultLeaseName, metav1.GetOptions{})
			if err == nil && lease.Spec.HolderIdentity != nil {
				idx := int32(-1)
				for i := range f.replicas {
					if strings.HasPrefix(*lease.Spec.HolderIdentity, fmt.Sprintf("replica-%d_", i)) {
						idx = int32(i)
					}
				}
				if old := f.leader.Swap(idx); old != idx {
					f.logf("leader: replica %d (Lease holder %q)", idx, *lease.Spec.HolderIdentity)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
}

// currentLeader is the replica that holds the Lease, if it runs.
func (f *faultRun) currentLeader() *replica {
	i := f.leader.Load()
	if i < 0 || !f.replicas[i].alive() {
		return nil
	}
	return f.replicas[i]
}

func (f *faultRun) killLeader(rng *rand.Rand) {
	r := f.currentLeader()
	if r == nil {
		return
	}
	r.kill()
	f.logf("killed replica %d, the leader", r.idx)
	time.Sleep(time.Duration(rng.IntN(2000)) * time.Millisecond)
	f.restartReplica(r)
}

// restartExited starts again, a second later, a replica that exited by
// itself, as its Deployment's kubelet would: controller-runtime exits when
// it finds it lost the leadership, as a paused leader does once resumed.
func (f *faultRun) restartExited(r *replica, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopping {
		return
	}
	f.restarts.Add(1)
	f.counts["replica-exited"]++
	go func() {
		defer f.restarts.Done()
		f.logf("replica %d exited by itself (%v); starting it again in 1s", r.idx, err)
		time.Sleep(time.Second)
		f.mu.Lock()
		stopping := f.stopping
		f.mu.Unlock()
		if !stopping {
			f.restartReplica(r)
		}
	}()
}

func (f *faultRun) restartReplica(r *replica) {
	if err := r.start(); err != nil {
		f.t.Errorf("restart replica %d: %v", r.idx, err)
		return
	}
	f.logf("replica %d started again", r.idx)
}

// pauseLeader stops the leader for 1-8s, sometimes longer than the
// election lease, and sometimes restarts Redis empty meanwhile.
func (f *faultRun) pauseLeader(rng *rand.Rand) {
	r := f.currentLeader()
	if r == nil {
		return
	}
	d := time.Duration(1000+rng.IntN(7000)) * time.Millisecond
	r.pause()
	f.logf("paused replica %d, the leader, for %v", r.idx, d)
	if rng.IntN(5) < 2 {
		time.Sleep(d / 2)
		f.restartRedis()
		time.Sleep(d / 2)
	} else {
		time.Sleep(d)
	}
	r.resume()
	f.logf("resumed replica %d", r.idx)
}

// pauseLeaderMidGrant pauses the leader the moment it takes a key in Redis
// for a pod, before it can mark and ungate the pod, for longer than the
// election lease, so the other replica leads meanwhile. Redis restarts
// empty during the pause, and the lock's selector is edited to leave that
// pod out; then the old leader resumes. The API server must refuse its
// stale ungate (issue 20, case 10).
func (f *faultRun) pauseLeaderMidGrant(rng *rand.Rand) {
	if f.currentLeader() == nil {
		return
	}
	for len(f.midGrant) > 0 {
		<-f.midGrant
	}
	f.armed.Store(true)
	var hit midGrantHit
	select {
	case hit = <-f.midGrant:
	case <-time.After(10 * time.Second):
		f.armed.Store(false)
		f.logf("mid-grant pause: no grant within 10s")
		return
	}
	r := f.replicas[hit.replica]
	d := faultElectionLease + time.Duration(3000+rng.IntN(3000))*time.Millisecond
	start := time.Now()
	// A patch already on its way lands within milliseconds: after that,
	// the pod's gate tells whether the pause came before the ungate.
	time.Sleep(200 * time.Millisecond)
	pod := f.podOfOwner(hit.owner)
	name, when := "a pod not found", "after a grant"
	if pod != nil {
		name = pod.Namespace + "/" + pod.Name
		when = "too late: the pod was already ungated"
		for _, g := range pod.Spec.SchedulingGates {
			lock, ok := strings.CutPrefix(g.Name, locksv1.GatePrefix)
			if key, known := lockKeys.Load(lockRef{pod.Namespace, lock}); ok && known && key == hit.key {
				when = "mid-grant, before the ungate"
			}
		}
	}
	if strings.HasPrefix(when, "mid-grant") {
		f.count("mid-grant-hit")
	} else {
		f.count("mid-grant-late")
	}
	f.logf("paused replica %d %s: it took %s for %s (%s); pause %v", r.idx, when, hit.key, name, hit.owner, d)
	if rng.IntN(4) != 0 {
		f.restartRedis()
	}
	if pod != nil {
		// Leave the pod out of the selector of the locks whose gate it carries.
		other := "x"
		if pod.Labels["variant"] == "x" {
			other = "y"
		}
		for _, g := range pod.Spec.SchedulingGates {
			if lock, ok := strings.CutPrefix(g.Name, locksv1.GatePrefix); ok && rng.IntN(3) != 0 {
				sel := allPods(lockRef{pod.Namespace, lock})
				sel.MatchLabels["variant"] = locksv1.LabelValue(other)
				f.setSelector(lockRef{pod.Namespace, lock}, sel)
			}
		}
	}
	time.Sleep(time.Until(start.Add(d)))
	r.resume()
	f.logf("resumed replica %d", r.idx)
}

// podOfOwner finds the pod whose UID starts the owner ID.
func (f *faultRun) podOfOwner(owner string) *corev1.Pod {
	uid, _, _ := strings.Cut(owner, ":")
	for _, ns := range []string{f.nsA, f.nsB} {
		list, err := f.cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return nil
		}
		for i := range list.Items {
			if string(list.Items[i].UID) == uid {
				return &list.Items[i]
			}
		}
	}
	return nil
}

// notifyGrants watches Redis's keyspace notifications of hash commands on
// the run's keys and, while armed, pauses the leader at the first HSET or
// HINCRBY of a lock's hash, which is how the acquire script writes an
// owner: before the controller can patch the pod. A release (HINCRBY -1,
// then DEL) is told apart afterwards, and the leader resumed at once.
func (f *faultRun) notifyGrants() {
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(cancel)
	f.configureNotifications()
	ps := f.rdb.PSubscribe(ctx, "__keyspace@0__:*")
	f.t.Cleanup(func() { ps.Close() })
	go func() {
		for msg := range ps.Channel() {
			key := strings.TrimPrefix(msg.Channel, "__keyspace@0__:")
			if (msg.Payload != "hset" && msg.Payload != "hincrby") || !slices.Contains(f.keys(), key) || !f.armed.Load() {
				continue
			}
			r := f.currentLeader()
			if r == nil {
				continue
			}
			r.pause()
			fields, err := f.rdb.HGetAll(ctx, key).Result()
			var owner string
			for field := range fields {
				if strings.HasSuffix(field, ":0") {
					owner = field
				}
			}
			if err != nil || owner == "" {
				r.resume() // a release, or Redis went away: not a grant
				continue
			}
			if f.armed.CompareAndSwap(true, false) {
				f.midGrant <- midGrantHit{key: key, replica: r.idx, owner: owner}
			} else {
				r.resume()
			}
		}
	}()
}

// configureNotifications has Redis publish keyspace events of hash
// commands; a restarted Redis forgets it.
func (f *faultRun) configureNotifications() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.rdb.ConfigSet(ctx, "notify-keyspace-events", "Kh").Err(); err != nil {
		f.t.Errorf("configure Redis keyspace notifications: %v", err)
	}
}

// restartRedis kills Redis and starts it again, empty.
func (f *faultRun) restartRedis() {
	f.redisMu.Lock()
	defer f.redisMu.Unlock()
	f.redis.Stop()
	if err := f.redis.Restart(); err != nil {
		f.t.Errorf("restart Redis: %v", err)
		return
	}
	f.configureNotifications()
	f.count("redis-restarted")
	f.logf("Redis restarted empty")
}

func (f *faultRun) pauseRedis(rng *rand.Rand) {
	f.redisMu.Lock()
	defer f.redisMu.Unlock()
	d := time.Duration(1000+rng.IntN(4000)) * time.Millisecond
	if err := f.redis.Pause(); err != nil {
		f.t.Errorf("pause Redis: %v", err)
		return
	}
	f.logf("paused Redis for %v", d)
	time.Sleep(d)
	if err := f.redis.Resume(); err != nil {
		f.t.Errorf("resume Redis: %v", err)
	}
}

// pauseAPIServer stops kube-apiserver for 1-3s: every client's requests
// and watches stall, the managers' and kwok's alike.
func (f *faultRun) pauseAPIServer(rng *rand.Rand) {
	f.apiPause.Lock()
	defer f.apiPause.Unlock()
	d := time.Duration(1000+rng.IntN(2000)) * time.Millisecond
	if err := syscall.Kill(f.apiserver, syscall.SIGSTOP); err != nil {
		f.t.Errorf("pause kube-apiserver: %v", err)
		return
	}
	f.logf("paused the API server for %v", d)
	time.Sleep(d)
	if err := syscall.Kill(f.apiserver, syscall.SIGCONT); err != nil {
		f.t.Fatalf("resume kube-apiserver: %v", err)
	}
}

// recover ends every fault: replicas resumed and running, Redis running,
// deleted locks back, selectors back to every pod. Then it waits for every
// Job to finish.
func (f *faultRun) recover() {
	f.armed.Store(false)
	for _, r := range f.replicas {
		r.resume()
		if !r.alive() {
			f.restartReplica(r)
		}
	}
	// Selectors first: a lock being deleted waits for the pods whose gate
	// it lifted to stop, and such a pod may wait for its next lock, whose
	// selector a fault left it out of.
	f.logf("faults over; restoring selectors, then waiting for deleted locks to be created again")
	for _, l := range f.locks() {
		f.setSelector(l.ref, allPods(l.ref)) // one deleted meanwhile comes back with it
	}
	f.pending.Wait()
	for _, l := range f.locks() {
		err := f.k8s.Get(context.Background(), client.ObjectKey{Namespace: l.ref.namespace, Name: l.ref.name}, &locksv1.DistributedLock{})
		if apierrors.IsNotFound(err) {
			f.createLock(l)
		}
	}
	f.logf("restored; waiting up to %v for every Job to finish", faultRecovery)
	deadline := time.Now().Add(faultRecovery)
	for f.unfinishedJobs() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Second)
	}
	f.logf("recovery over")
}

// check counts what went wrong, from kwok's run stamps and the pods'
// marks: overlapping runs per key, fencing tokens that did not rise from
// one holder to the next, Jobs that never finished.
func (f *faultRun) check() {
	t := f.t
	var overlapping, regressions, ran int
	for _, key := range f.keys() {
		runs := checkKey(t, key) // reports each overlap
		ran += len(runs)
		if o := overlaps(runs); len(o) > 0 {
			overlapping += len(o)
			f.describeOverlap(runs, o)
		}
		r := tokenRegressions(runs)
		regressions += len(r)
		for i, v := range r {
			if i == 10 {
				t.Errorf("key %s: %d more token regressions", key, len(r)-10)
				break
			}
			t.Errorf("key %s: fencing token regression: %s", key, v)
		}
	}
	var unfinished []string
	for _, ns := range []string{f.nsA, f.nsB} {
		list, err := f.cs.BatchV1().Jobs(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range list.Items {
			if !finished(&list.Items[i]) {
				unfinished = append(unfinished, ns+"/"+list.Items[i].Name)
			}
		}
	}
	for i, j := range unfinished {
		if i == 10 {
			break
		}
		ns, name, _ := strings.Cut(j, "/")
		t.Errorf("Job %s never finished: %s", j, f.describeJobPods(ns, name))
	}
	if len(unfinished) > 0 {
		f.describeLocks()
	}
	f.mu.Lock()
	counts := fmt.Sprint(f.counts)
	f.mu.Unlock()
	t.Logf("fault run: %s; %d pods ran; %d overlapping runs, %d token regressions, %d Jobs unfinished",
		counts, ran, overlapping, regressions, len(unfinished))
	if ran == 0 {
		t.Errorf("no guarded pod ran: the run tested nothing")
	}
	// For the record, not the verdict: how often the replicas' logs say the
	// API server refused a stale manager's fencing record or gate lift.
	refused := 0
	for _, r := range f.replicas {
		data, _ := os.ReadFile(r.log)
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "records a higher fencing token than") || strings.Contains(line, "the grant it comes from was replaced") {
				refused++
			}
		}
	}
	t.Logf("the replicas' logs name %d refusals of a stale fencing record or gate lift", refused)
}

// describeOverlap logs, for each pod of an overlap, the tokens it was
// marked with and what the replicas' logs say of it, to tell which replica
// let it run and why (the check itself never reads them).
func (f *faultRun) describeOverlap(runs []podRun, overlaps []string) {
	for _, r := range runs {
		if !slices.ContainsFunc(overlaps, func(o string) bool { return strings.Contains(o, r.pod+" ") }) {
			continue
		}
		_, name, _ := strings.Cut(r.pod, "/")
		f.t.Logf("pod %s (uid %s), marked with tokens %v; the replicas' log lines naming it:", r.pod, r.uid, r.tokens)
		for _, rep := range f.replicas {
			data, _ := os.ReadFile(rep.log)
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, name) || strings.Contains(line, string(r.uid)) {
					f.t.Logf("replica %d: %s", rep.idx, line)
				}
			}
		}
	}
}

// describeLocks logs what the locks' status and Redis say, to tell why
// Jobs did not finish (the check itself never reads them).
func (f *faultRun) describeLocks() {
	ctx := context.Background()
	for _, l := range f.locks() {
		lock := &locksv1.DistributedLock{}
		if err := f.k8s.Get(ctx, client.ObjectKey{Namespace: l.ref.namespace, Name: l.ref.name}, lock); err != nil {
			f.t.Logf("lock %s/%s: %v", l.ref.namespace, l.ref.name, err)
			continue
		}
		var conds []string
		for _, c := range lock.Status.Conditions {
			conds = append(conds, fmt.Sprintf("%s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message))
		}
		f.t.Logf("lock %s/%s (uid %s): holder %+v, grant %+v, waiting %v, blocked %+v, conditions %v", l.ref.namespace, l.ref.name, lock.UID,
			lock.Status.Holder, lock.Status.Grant, lock.Status.Waiting, lock.Status.Blocked, conds)
	}
	for _, key := range f.keys() {
		fields, err := f.rdb.HGetAll(ctx, key).Result()
		ttl, _ := f.rdb.PTTL(ctx, key).Result()
		f.t.Logf("Redis %s: %v (err %v), PTTL %v", key, fields, err, ttl)
	}
}

func (f *faultRun) describeJobPods(ns, job string) string {
	list, err := f.cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, p := range list.Items {
		var gates []string
		for _, g := range p.Spec.SchedulingGates {
			gates = append(gates, g.Name)
		}
		var marks []string
		for k, v := range p.Annotations {
			if strings.HasSuffix(strings.SplitN(k, "/", 2)[0], "lockwarden.dev") && !strings.HasPrefix(k, "plane.") {
				marks = append(marks, k+"="+v)
			}
		}
		slices.Sort(marks)
		var told []string
		if events, err := f.cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name}); err == nil {
			for _, e := range events.Items {
				told = append(told, fmt.Sprintf("%s x%d: %s", e.Reason, e.Count, e.Message))
			}
		}
		out = append(out, fmt.Sprintf("pod %s (uid %s) %s, labels %v, gates %v, marks %v, deleting %v, events %q",
			p.Name, p.UID, p.Status.Phase, p.Labels, gates, marks, p.DeletionTimestamp != nil, told))
	}
	return strings.Join(out, "; ")
}

// replica is one manager process of the run, with leader election. It
// runs in a mount namespace whose /var/run/secrets holds the namespace
// file controller-runtime reads to place its Lease (as in a pod), and a
// UTS namespace whose host name, replica-<i>, starts its Lease identity.
type replica struct {
	idx                            int
	bin, kubeconfig, redisURL, log string
	args                           []string
	// exitedByItself, if set, is called when the process exits unasked
	// (controller-runtime exits once it has lost the leadership); it must
	// not block.
	exitedByItself func(r *replica, err error)

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	paused bool
}

// replicaWrapper prepares the replica's namespaces, then execs the
// manager: the process ID stays the manager's, for the signals.
var replicaWrapper = []string{"unshare", "--mount", "--uts", "--propagation", "private", "--", "/bin/sh", "-c",
	`mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && ` +
		`printf %s "$LEASE_NAMESPACE" >/run/secrets/kubernetes.io/serviceaccount/namespace && hostname "$REPLICA" && exec "$@"`,
	"sh"}

func (r *replica) start() error {
	r.mu.Lock()
	if r.cmd != nil {
		r.mu.Unlock()
		return nil
	}
	onExit := func(cmd *exec.Cmd, err error) {
		r.mu.Lock()
		unasked := r.cmd == cmd // end clears it first
		if unasked {
			r.cmd, r.paused = nil, false
		}
		r.mu.Unlock()
		if unasked && r.exitedByItself != nil {
			r.exitedByItself(r, err)
		}
	}
	cmd, exited, probe, err := spawnManager(replicaWrapper,
		append([]string{r.bin, "--kubeconfig", r.kubeconfig}, r.args...),
		[]string{"REDIS_URL=" + r.redisURL, "LEASE_NAMESPACE=" + faultLeaseNamespace, fmt.Sprintf("REPLICA=replica-%d", r.idx)},
		r.log, onExit)
	if err == nil {
		r.cmd, r.exited, r.paused = cmd, exited, false
	}
	r.mu.Unlock()
	if err != nil {
		return err
	}
	// /healthz: /readyz needs Redis, which may be down.
	if err := waitHealthy(context.Background(), "http://"+probe+"/healthz", exited, fmt.Sprintf("replica %d", r.idx), r.log); err != nil {
		r.end(syscall.SIGKILL, 0)
		return err
	}
	return nil
}

func (r *replica) alive() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd != nil
}

func (r *replica) signal(sig syscall.Signal) {
	if r.cmd != nil {
		_ = r.cmd.Process.Signal(sig)
	}
}

func (r *replica) pause() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil && !r.paused {
		r.signal(syscall.SIGSTOP)
		r.paused = true
	}
}

func (r *replica) resume() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.paused {
		r.signal(syscall.SIGCONT)
		r.paused = false
	}
}

// kill kills the replica (SIGKILL), as a crash or an OOM kill would.
func (r *replica) kill() { r.end(syscall.SIGKILL, 0) }

// stop stops the replica gracefully; it releases its Lease.
func (r *replica) stop() { r.end(syscall.SIGTERM, 10*time.Second) }

// end sends sig (after SIGCONT: a stopped process acts on nothing) and
// waits for the replica to exit, killing it after grace.
func (r *replica) end(sig syscall.Signal, grace time.Duration) {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.cmd, r.paused = nil, false // asked to end: not started again
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
		return
	case <-time.After(grace):
	}
	_ = cmd.Process.Kill()
	<-exited
}
