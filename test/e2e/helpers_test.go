package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/plane"
)

// podRecorder remembers the last state seen of every pod, deleted ones
// included (a pod deleted after it ran still counts for overlaps), and
// what no single version may show any more: the lockwarden gates a pod
// carried and the fencing tokens it was marked with.
type podRecorder struct {
	mu   sync.Mutex
	pods map[types.UID]*podRecord
	done chan struct{}
}

// podRecord is what the recorder knows of one pod.
type podRecord struct {
	last *corev1.Pod
	// gates are the locks (by name, in the pod's namespace) whose gate the
	// pod carried in any version seen. A gate can only be removed after
	// creation, never added, so this is the pod's guard as created.
	gates map[string]bool
	// tokens are the fencing tokens the pod was marked with, by lock name,
	// each once, in the order seen.
	tokens map[string][]int64
	// ended is when the pod was first seen Succeeded or Failed, deleted
	// when it was seen gone, stopped when the test declared its containers
	// stopped (declareStopped).
	ended, deleted, stopped time.Time
}

func startPodRecorder(cs kubernetes.Interface) *podRecorder {
	r := &podRecorder{pods: map[types.UID]*podRecord{}, done: make(chan struct{})}
	factory := informers.NewSharedInformerFactory(cs, 0)
	informer := factory.Core().V1().Pods().Informer()
	note := func(obj any, gone bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		rec := r.pods[pod.UID]
		if rec == nil {
			rec = &podRecord{gates: map[string]bool{}, tokens: map[string][]int64{}}
			r.pods[pod.UID] = rec
		}
		rec.last = pod
		for _, g := range pod.Spec.SchedulingGates {
			if lock, ok := strings.CutPrefix(g.Name, locksv1.GatePrefix); ok {
				rec.gates[lock] = true
			}
		}
		for k, v := range pod.Annotations {
			lock, ok := strings.CutPrefix(k, locksv1.TokenAnnotationPrefix)
			if !ok {
				continue
			}
			if token, err := strconv.ParseInt(v, 10, 64); err == nil && !slices.Contains(rec.tokens[lock], token) {
				rec.tokens[lock] = append(rec.tokens[lock], token)
			}
		}
		if rec.ended.IsZero() && (pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed) {
			rec.ended = time.Now()
		}
		if gone {
			rec.deleted = time.Now()
		}
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { note(obj, false) },
		UpdateFunc: func(_, obj any) { note(obj, false) },
		DeleteFunc: func(obj any) { note(obj, true) },
	})
	factory.Start(r.done)
	factory.WaitForCacheSync(r.done)
	return r
}

func (r *podRecorder) stop() { close(r.done) }

// declareStopped tells the recorder that the pod's containers stopped at
// at, for a pod whose end kwok cannot play: one on a node cut off, whose
// end an administrator declares, or one deleted with no grace period,
// which is gone when the API server answers.
func (r *podRecorder) declareStopped(uid types.UID, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec := r.pods[uid]; rec != nil {
		rec.stopped = at
	}
}

// podRun is one pod's runs as kwok stamped them.
type podRun struct {
	pod  string // namespace/name
	uid  types.UID
	runs []plane.Run // of its containers, restarts included
	// busy are the spans in which any of its containers ran; the last has
	// a zero End while it runs.
	busy []plane.Interval
	// tokens are the fencing tokens the pod was marked with for the key.
	tokens []int64
}

func (p podRun) start() time.Time { return p.busy[0].Start }

// end is when its last container stopped; zero while one runs.
func (p podRun) end() time.Time { return p.busy[len(p.busy)-1].End }

// selectRuns are the runs of the pods that pick accepts (with the
// locks whose gate they carried), ordered by first start; pods that never
// ran are left out. The runs come from kwok's stamps of each container
// start and stop (plane.Runs): what the kubelet did, nothing the
// controller says. A run kwok did not end (a pod deleted with no grace
// period, or on a node kwok no longer plays) ended when the test declared
// it (declareStopped), or else when the pod was first seen Succeeded,
// Failed or gone, a little late: the check errs towards finding an
// overlap.
func (r *podRecorder) selectRuns(t testing.TB, pick func(pod *corev1.Pod, gates map[string]bool) bool, tokensOf func(pod *corev1.Pod, tokens map[string][]int64) []int64) []podRun {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []podRun
	for uid, rec := range r.pods {
		if !pick(rec.last, rec.gates) {
			continue
		}
		runs, err := plane.Runs(rec.last)
		if err != nil {
			t.Errorf("kwok's run stamps cannot be read: %v", err)
			continue
		}
		if len(runs) == 0 {
			continue
		}
		end := rec.stopped
		for _, at := range []time.Time{rec.ended, rec.deleted} {
			if end.IsZero() || (!at.IsZero() && at.Before(end)) {
				end = at
			}
		}
		for i := range runs {
			if runs[i].End.IsZero() && !end.IsZero() {
				runs[i].End = end
				if end.Before(runs[i].Start) {
					runs[i].End = runs[i].Start
				}
			}
		}
		run := podRun{pod: rec.last.Namespace + "/" + rec.last.Name, uid: uid, runs: runs, busy: plane.Busy(runs)}
		if tokensOf != nil {
			run.tokens = tokensOf(rec.last, rec.tokens)
		}
		out = append(out, run)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start().Before(out[j].start()) })
	return out
}

// lockRef names a DistributedLock.
type lockRef struct{ namespace, name string }

// lockKeys maps each lock the tests made to its key, as the test wrote it
// in the lock's spec (never read back from the controller).
var lockKeys sync.Map // lockRef -> string

// declareLock records the key of a lock a test creates.
func declareLock(namespace, name, key string) {
	lockKeys.Store(lockRef{namespace, name}, key)
}

// guardedBy reports whether a pod with these gates is guarded by key.
func guardedBy(namespace string, gates map[string]bool, key string) bool {
	for lock := range gates {
		if k, ok := lockKeys.Load(lockRef{namespace, lock}); ok && k == key {
			return true
		}
	}
	return false
}

// keyRuns are the runs of the pods guarded by key: those that carried the
// gate of a lock whose spec names the key.
func (r *podRecorder) keyRuns(t testing.TB, key string) []podRun {
	t.Helper()
	return r.selectRuns(t,
		func(pod *corev1.Pod, gates map[string]bool) bool { return guardedBy(pod.Namespace, gates, key) },
		func(pod *corev1.Pod, tokens map[string][]int64) []int64 {
			var out []int64
			for lock, ts := range tokens {
				if k, ok := lockKeys.Load(lockRef{pod.Namespace, lock}); ok && k == key {
					out = append(out, ts...)
				}
			}
			slices.Sort(out)
			return slices.Compact(out)
		})
}

// overlaps describes every pair of runs of two different pods that
// overlap: a pod runs while any of its containers runs.
func overlaps(runs []podRun) []string {
	var out []string
	for i := range runs {
		for j := i + 1; j < len(runs); j++ {
			for _, a := range runs[i].busy {
				for _, b := range runs[j].busy {
					if (a.End.IsZero() || b.Start.Before(a.End)) && (b.End.IsZero() || a.Start.Before(b.End)) {
						out = append(out, fmt.Sprintf("%s ran %s while %s ran %s",
							runs[j].pod, span(b), runs[i].pod, span(a)))
					}
				}
			}
		}
	}
	return out
}

func span(iv plane.Interval) string {
	end := "on"
	if !iv.End.IsZero() {
		end = iv.End.Format("15:04:05.000000")
	}
	return iv.Start.Format("15:04:05.000000") + "-" + end
}

// tokenRegressions describes every pod of runs (ordered by first start)
// whose fencing token is not above every token of the pods that started
// before it: grants of one key must carry rising tokens.
func tokenRegressions(runs []podRun) []string {
	var out []string
	var highest int64
	var before podRun
	for _, r := range runs {
		if len(r.tokens) == 0 {
			continue
		}
		if low := r.tokens[0]; low <= highest {
			out = append(out, fmt.Sprintf("%s, which started at %s, was marked with token %d, not above token %d of %s, which started at %s",
				r.pod, r.start().Format("15:04:05.000000"), low, highest, before.pod, before.start().Format("15:04:05.000000")))
		}
		if high := r.tokens[len(r.tokens)-1]; high > highest {
			highest, before = high, r
		}
	}
	return out
}

// reported holds, per test, the violations already reported, so the check
// at a test's end does not repeat what the test itself checked.
var reported sync.Map // test (its address) + violation -> struct{}

// checkKey is the shared check of the guard's promise: it fails the test
// on any two pods guarded by key whose runs, as kwok stamped them,
// overlap. It returns the runs for further checks. Every test on the plane
// ends with it for every key it made a lock for (newLock, guardKey).
func checkKey(t testing.TB, key string) []podRun {
	t.Helper()
	runs := pods.keyRuns(t, key)
	t.Logf("runs of key %s: %s", key, describeRuns(runs))
	for _, v := range overlaps(runs) {
		if _, dup := reported.LoadOrStore(fmt.Sprintf("%p\x00%s", t, v), struct{}{}); !dup {
			t.Errorf("two guarded pods of key %s ran at once: %s", key, v)
		}
	}
	return runs
}

// guardKey makes the test end with checkKey for key, once per test and key.
func guardKey(t testing.TB, key string) {
	t.Helper()
	if _, dup := reported.LoadOrStore(fmt.Sprintf("%p\x00guard %s", t, key), struct{}{}); dup {
		return
	}
	t.Cleanup(func() { checkKey(t, key) })
}

// describeRuns lists the pods' runs, to the millisecond, with their
// restarts.
func describeRuns(runs []podRun) string {
	var desc []string
	for _, r := range runs {
		var spans []string
		for _, b := range r.busy {
			spans = append(spans, span(b))
		}
		desc = append(desc, fmt.Sprintf("%s %s", r.pod, strings.Join(spans, " ")))
	}
	return strings.Join(desc, "; ")
}

// lockName is the name of the DistributedLock in each test's namespace, and
// so of its gate.
const lockName = "guard"

// guardedTemplate is a pod template guarded by the lock's gate, labelled
// for the lock and the recorder, that runs for runFor once ungated.
func guardedTemplate(label string, runFor time.Duration, grace int64) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Labels:      map[string]string{label: "yes"},
			Annotations: map[string]string{plane.CompleteDelayAnnotation: runFor.String()},
		},
		Spec: corev1.PodSpec{
			SchedulingGates:               []corev1.PodSchedulingGate{{Name: locksv1.GateFor(lockName)}},
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To(grace),
			Containers:                    []corev1.Container{{Name: "work", Image: "busybox"}},
		},
	}
}

// newNamespace creates a namespace and waits for its default
// ServiceAccount; it returns the namespace.
func newNamespace(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	ns, err := clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := plane.WaitForServiceAccount(ctx, clientset, ns.Name); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// newLock creates a namespace and a DistributedLock there whose candidates
// carry label; it returns the namespace.
func newLock(t testing.TB, label string) string {
	t.Helper()
	ns := newNamespace(t)
	lock := &locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: lockName, Namespace: ns},
		Spec: locksv1.DistributedLockSpec{
			LeaseDuration: &metav1.Duration{Duration: 5 * time.Second},
			Candidates:    &locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{label: "yes"}},
		},
	}
	if err := k8s.Create(context.Background(), lock); err != nil {
		t.Fatal(err)
	}
	declareLock(ns, lockName, keyOf(ns))
	guardKey(t, keyOf(ns))
	return ns
}

// keyOf is the key of the lock newLock makes in ns: the default,
// <namespace>/<name>.
func keyOf(ns string) string { return ns + "/" + lockName }

func createJob(t testing.TB, ns, name string, spec batchv1.JobSpec) *batchv1.Job {
	t.Helper()
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	job, err := clientset.BatchV1().Jobs(ns).Create(context.Background(), job, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

func jobSpec(label string, runFor time.Duration) batchv1.JobSpec {
	return batchv1.JobSpec{BackoffLimit: ptr.To[int32](0), Template: guardedTemplate(label, runFor, 0)}
}

func jobCondition(ns, name string, cond batchv1.JobConditionType) (bool, error) {
	job, err := clientset.BatchV1().Jobs(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(job.Status.Conditions, func(c batchv1.JobCondition) bool {
		return c.Type == cond && c.Status == corev1.ConditionTrue
	}), nil
}

// eventually polls cond every 100ms until it holds, failing the test after
// timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (last error: %v)", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runningPod is the one pod with label in ns that runs now, or nil.
func runningPod(ns, label string) (*corev1.Pod, error) {
	list, err := clientset.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: label})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		if p := &list.Items[i]; p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			return p, nil
		}
	}
	return nil, nil
}

func waitRunning(t testing.TB, ns, label string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, 30*time.Second, "a guarded pod running", func() (bool, error) {
		var err error
		pod, err = runningPod(ns, label)
		return pod != nil, err
	})
	return pod
}

// gatedPods counts the pods with label in ns still behind the lock's gate.
func gatedPods(ns, label string) (int, error) {
	list, err := clientset.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: label})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range list.Items {
		if slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == locksv1.GateFor(lockName) }) {
			n++
		}
	}
	return n, nil
}
