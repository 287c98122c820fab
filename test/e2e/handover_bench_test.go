package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/lockwarden/lockwarden/internal/plane"
)

// handOverSamples is how many hand-overs each row measures. With fewer
// than 100, the p99 is the largest sample.
const handOverSamples = 40

// handOverTarget is issue 13's bound on a hand-over.
const handOverTarget = time.Second

// handOverRun is how long each Job's pod runs in the rows that let pods
// complete on their own.
const handOverRun = 300 * time.Millisecond

// BenchmarkHandOver measures on the local control plane, with the real
// manager, how long the next guarded pod takes to run once the holder is
// gone, over handOverSamples hand-overs per row (use -benchtime=1x):
//   - the holder's Job pod completes, with the next Jobs' pods queued
//     behind the gate: from the holder's containers stopping to the next
//     pod's running, both as kwok stamps them;
//   - the holder pod is deleted with a grace period of 0, so its object is
//     gone when the API server answers: from that answer to the next pod's
//     running stamp;
//   - a peer with no lock: one Job with parallelism 1 running its pods one
//     after another, Kubernetes' own way to run pods one at a time: from a
//     pod's stop stamp to the next one's running stamp;
//   - the plane's floor: a gate removed by hand from a lone pod, from the
//     API server's answer to its running stamp (the scheduler and kwok,
//     which every hand-over above includes).
//
// Every row but the floor, whose lone pods run on, is also checked for
// overlapping runs.
func BenchmarkHandOver(b *testing.B) {
	for range b.N {
		rows := []struct {
			name, metric string
			samples      []time.Duration
		}{
			{"lockwarden: the holder completes", "complete", handOverOnCompletion(b)},
			{"lockwarden: the holder is deleted (object gone at once)", "delete", handOverOnDeletion(b)},
			{"peer: one Job, parallelism 1, no lock", "job", jobSeries(b)},
			{"floor: a gate removed by hand, to Running", "floor", gateRemoved(b)},
		}
		var table strings.Builder
		fmt.Fprintf(&table, "\n| hand-over, %d samples each | p50 | p99 (the largest) | p99 / target (%v) |\n|---|---|---|---|\n", handOverSamples, handOverTarget)
		for _, r := range rows {
			slices.Sort(r.samples)
			p50, p99 := r.samples[len(r.samples)/2], r.samples[len(r.samples)*99/100]
			b.ReportMetric(float64(p50.Microseconds())/1000, r.metric+"-p50-ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, r.metric+"-p99-ms")
			fmt.Fprintf(&table, "| %s | %v | %v | %.3f |\n", r.name, p50.Round(time.Millisecond), p99.Round(time.Millisecond), p99.Seconds()/handOverTarget.Seconds())
		}
		b.Log(table.String())
	}
}

// handOverOnCompletion queues handOverSamples+1 Jobs behind one lock and
// measures the gaps between one pod's stop and the next one's start.
func handOverOnCompletion(b *testing.B) []time.Duration {
	const label = "e2e.lockwarden.dev/bench-complete"
	ns := newLock(b, label)
	for i := range handOverSamples + 1 {
		createJob(b, ns, fmt.Sprintf("run-%02d", i), jobSpec(label, handOverRun))
	}
	for i := range handOverSamples + 1 {
		eventually(b, 3*time.Minute, "every Job complete", func() (bool, error) {
			return jobCondition(ns, fmt.Sprintf("run-%02d", i), batchv1.JobComplete)
		})
	}
	return gaps(b, checkKey(b, keyOf(ns)))
}

// handOverOnDeletion starts handOverSamples+1 guarded pods that run until
// deleted, with no grace period, and deletes each holder in turn.
func handOverOnDeletion(b *testing.B) []time.Duration {
	const label = "e2e.lockwarden.dev/bench-delete"
	ctx := context.Background()
	ns := newLock(b, label)
	tpl := guardedTemplate(label, 0, 0)
	for i := range handOverSamples + 1 {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%02d", i), Namespace: ns, Labels: tpl.Labels}, Spec: tpl.Spec}
		if _, err := clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	// A holder deleted with no grace period is gone when the API server
	// answers: it stopped then, as far as the check goes. The pod recorder
	// would see the removal a watch event late, later than the next pod
	// may rightly start.
	var samples []time.Duration
	holder := waitRunning(b, ns, label)
	for range handOverSamples {
		asked := time.Now()
		if err := clientset.CoreV1().Pods(ns).Delete(ctx, holder.Name, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
		gone := time.Now()
		if _, err := clientset.CoreV1().Pods(ns).Get(ctx, holder.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			b.Fatalf("%s still there after its deletion with no grace period (err %v)", holder.Name, err)
		}
		pods.declareStopped(holder.UID, asked)
		holder = waitRunning(b, ns, label)
		samples = append(samples, runningAt(b, ns, holder.Name).Sub(gone))
	}
	if runs := checkKey(b, keyOf(ns)); len(runs) != handOverSamples+1 {
		b.Fatalf("%d runs, want %d", len(runs), handOverSamples+1)
	}
	return samples
}

// jobSeries runs one Job of handOverSamples+1 completions, one pod at a
// time, with no lock, and measures the gaps between its pods.
func jobSeries(b *testing.B) []time.Duration {
	const label = "e2e.lockwarden.dev/bench-job"
	ns := newNamespace(b)
	tpl := guardedTemplate(label, handOverRun, 0)
	tpl.Spec.SchedulingGates = nil
	createJob(b, ns, "series", batchv1.JobSpec{
		Completions:  ptr.To[int32](handOverSamples + 1),
		Parallelism:  ptr.To[int32](1),
		BackoffLimit: ptr.To[int32](0),
		Template:     tpl,
	})
	eventually(b, 5*time.Minute, "the Job complete", func() (bool, error) {
		return jobCondition(ns, "series", batchv1.JobComplete)
	})
	return gaps(b, checkedRuns(b, ns, label))
}

// gateRemoved creates handOverSamples lone pods behind a gate no lock owns,
// one at a time, and removes the gate once the scheduler has seen it.
func gateRemoved(b *testing.B) []time.Duration {
	const label = "e2e.lockwarden.dev/bench-floor"
	ctx := context.Background()
	ns := newNamespace(b)
	tpl := guardedTemplate(label, 0, 0)
	tpl.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "e2e.lockwarden.dev/by-hand"}}
	var samples []time.Duration
	for i := range handOverSamples {
		name := fmt.Sprintf("pod-%02d", i)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: tpl.Labels}, Spec: tpl.Spec}
		if _, err := clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		eventually(b, 30*time.Second, name+" SchedulingGated", func() (bool, error) {
			p, err := clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil && slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonSchedulingGated
			}), err
		})
		ungate := []byte(`[{"op":"remove","path":"/spec/schedulingGates"}]`)
		if _, err := clientset.CoreV1().Pods(ns).Patch(ctx, name, types.JSONPatchType, ungate, metav1.PatchOptions{}); err != nil {
			b.Fatal(err)
		}
		ungated := time.Now()
		samples = append(samples, runningAt(b, ns, name).Sub(ungated))
	}
	return samples
}

// checkedRuns are the runs of the pods with label in ns (no lock guards
// them), checked for overlaps.
func checkedRuns(b *testing.B, ns, label string) []podRun {
	runs := pods.selectRuns(b, func(pod *corev1.Pod, _ map[string]bool) bool {
		_, ok := pod.Labels[label]
		return pod.Namespace == ns && ok
	}, nil)
	for _, v := range overlaps(runs) {
		b.Errorf("two pods ran at once: %s", v)
	}
	return runs
}

// gaps are the times from each run's end to the next run's start.
func gaps(b *testing.B, runs []podRun) []time.Duration {
	if len(runs) != handOverSamples+1 {
		b.Fatalf("%d runs, want %d", len(runs), handOverSamples+1)
	}
	var out []time.Duration
	for i := 1; i < len(runs); i++ {
		out = append(out, runs[i].start().Sub(runs[i-1].end()))
	}
	return out
}

// runningAt waits for kwok's running stamp on the pod and returns it.
func runningAt(b *testing.B, ns, name string) time.Time {
	var at time.Time
	eventually(b, 30*time.Second, name+" stamped running", func() (bool, error) {
		p, err := clientset.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s, ok := p.Annotations[plane.RunningAtAnnotation]
		if !ok {
			return false, nil
		}
		at, err = time.Parse(time.RFC3339Nano, s)
		if err != nil {
			b.Fatalf("bad stamp %q: %v", s, err)
		}
		return true, nil
	})
	return at
}
