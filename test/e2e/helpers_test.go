package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
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
// included: a pod deleted after it ran still counts for overlaps.
type podRecorder struct {
	mu      sync.Mutex
	last    map[types.UID]*corev1.Pod
	ended   map[types.UID]time.Time // first seen Succeeded or Failed
	deleted map[types.UID]time.Time
	done    chan struct{}
}

func startPodRecorder(cs kubernetes.Interface) *podRecorder {
	r := &podRecorder{last: map[types.UID]*corev1.Pod{}, ended: map[types.UID]time.Time{}, deleted: map[types.UID]time.Time{}, done: make(chan struct{})}
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
		r.last[pod.UID] = pod
		if _, seen := r.ended[pod.UID]; !seen && (pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed) {
			r.ended[pod.UID] = time.Now()
		}
		if gone {
			r.deleted[pod.UID] = time.Now()
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

// interval is when one pod's containers ran; end is zero while they run.
type interval struct {
	pod        string
	start, end time.Time
}

// runs are the running intervals of the pods in namespace ns that carry
// label, judged from the stamps kwok writes when containers start and stop
// (RFC 3339 with nanoseconds; the status has the same instants to the
// second). A pod with no stop stamp, whose end kwok did not play (a forced
// deletion, or a pod on a node kwok no longer manages), stopped when it
// was first seen Succeeded or Failed, or deleted, whichever came first:
// the moment the API first said so, seen a little late, so the check errs
// towards finding an overlap.
func (r *podRecorder) runs(t testing.TB, ns, label string) []interval {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []interval
	for uid, pod := range r.last {
		if pod.Namespace != ns {
			continue
		}
		if _, ok := pod.Labels[label]; !ok {
			continue
		}
		started, ok := pod.Annotations[plane.RunningAtAnnotation]
		if !ok {
			continue
		}
		iv := interval{pod: pod.Name, start: parseStamp(t, started)}
		if stopped, ok := pod.Annotations[plane.StoppedAtAnnotation]; ok {
			iv.end = parseStamp(t, stopped)
		} else {
			for _, at := range []time.Time{r.ended[uid], r.deleted[uid]} {
				if !at.IsZero() && (iv.end.IsZero() || at.Before(iv.end)) {
					iv.end = at
				}
			}
		}
		out = append(out, iv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out
}

func parseStamp(t testing.TB, s string) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("bad stamp %q: %v", s, err)
	}
	return ts
}

// assertNoOverlap logs the runs of the pods with label in ns, fails the
// test if two of them overlap, and returns them for further checks.
func assertNoOverlap(t testing.TB, ns, label string) []interval {
	t.Helper()
	runs := pods.runs(t, ns, label)
	t.Logf("runs: %s", describeRuns(runs))
	checkNoOverlap(t, runs)
	return runs
}

// describeRuns lists the runs as "pod start-end", to the millisecond.
func describeRuns(runs []interval) string {
	var desc []string
	for _, iv := range runs {
		end := "running"
		if !iv.end.IsZero() {
			end = iv.end.Format("15:04:05.000")
		}
		desc = append(desc, fmt.Sprintf("%s %s-%s", iv.pod, iv.start.Format("15:04:05.000"), end))
	}
	return strings.Join(desc, ", ")
}

// checkNoOverlap fails the test if two of the runs, sorted by start,
// overlap.
func checkNoOverlap(t testing.TB, runs []interval) {
	t.Helper()
	for i := 1; i < len(runs); i++ {
		prev, cur := runs[i-1], runs[i]
		if prev.end.IsZero() || cur.start.Before(prev.end) {
			t.Errorf("two guarded pods ran at once: %s started at %s while %s ran (stopped %s)",
				cur.pod, cur.start.Format(time.RFC3339Nano), prev.pod, prev.end.Format(time.RFC3339Nano))
		}
	}
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
	return ns
}

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
