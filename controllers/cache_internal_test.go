package controllers

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
)

func TestIgnoreOwnMarks(t *testing.T) {
	base := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", ResourceVersion: "1", Labels: map[string]string{"app": "x"}, Annotations: map[string]string{}},
		Spec:       corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: locksv1.GateFor("l")}}},
	}
	cases := []struct {
		name   string
		change func(*corev1.Pod)
		wakes  bool
	}{
		{"own marks set", func(p *corev1.Pod) {
			setMarks(p, "l", "uid:0", 7)
			p.ResourceVersion = "2"
		}, false},
		{"another writer's label", func(p *corev1.Pod) { p.Labels["team"] = "a" }, true},
		{"own mark removed", func(p *corev1.Pod) { delete(p.Labels, locksv1.HolderLabelFor("l")) }, true},
		{"gate lifted", func(p *corev1.Pod) { p.Spec.SchedulingGates = nil }, true},
		{"phase", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, true},
		{"deletion started", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} }, true},
		{"own marks and a phase", func(p *corev1.Pod) {
			setMarks(p, "l", "uid:0", 7)
			p.Status.Phase = corev1.PodRunning
		}, true},
	}
	setMarks(base, "l", "uid:0", 6)
	for _, tc := range cases {
		after := base.DeepCopy()
		tc.change(after)
		if got := ignoreOwnMarks.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: after}); got != tc.wakes {
			t.Errorf("%s: wakes the controller = %v, want %v", tc.name, got, tc.wakes)
		}
	}
}

// The retries of a failing key spread out and grow to the cap; a success
// starts over; keys back off independently.
func TestRedisBackoff(t *testing.T) {
	var b redisBackoff
	var previous time.Duration
	for i := range 10 {
		want := min(redisRetryBase<<i, redisRetryCap)
		got := b.failed("k")
		if got < want*4/5 || got > want*6/5 {
			t.Fatalf("retry %d after %v, want %v ± 20%%", i, got, want)
		}
		if i < 7 && got <= previous {
			t.Fatalf("retry %d after %v, not later than the one before (%v)", i, got, previous)
		}
		previous = got
	}
	if got := b.failed("other"); got > redisRetryBase*6/5 {
		t.Fatalf("another key's first retry waits %v, want about %v", got, redisRetryBase)
	}
	b.succeeded("k")
	if got := b.failed("k"); got > redisRetryBase*6/5 {
		t.Fatalf("after a success the first retry waits %v, want about %v", got, redisRetryBase)
	}
	spread := map[time.Duration]bool{}
	for range 20 {
		var fresh redisBackoff
		spread[fresh.failed("k")] = true
	}
	if len(spread) < 10 {
		t.Fatalf("20 keys failing at once retry at only %d distinct times: no jitter", len(spread))
	}
}

// Case 9 of issue 20: after an API error a key is retried as after a Redis
// error, at most 30 s later, each retry moved by up to ±20%, rather than
// backing off to controller-runtime's 1000 s.
func TestAPIBackoffIsCappedAndJittered(t *testing.T) {
	limiter := newAPIBackoff()
	key := KeyRequest{Key: "k"}
	var longest time.Duration
	for range 40 {
		longest = max(longest, limiter.When(key))
	}
	if longest > redisRetryCap*6/5 || longest < redisRetryCap*4/5 {
		t.Fatalf("after 40 failures a retry waits %v, want about %v at most", longest, redisRetryCap)
	}
	limiter.Forget(key)
	if got := limiter.When(key); got > apiRetryBase*6/5 {
		t.Fatalf("after a success the first retry waits %v, want about %v", got, apiRetryBase)
	}
	spread := map[time.Duration]bool{}
	for i := range 20 {
		k := KeyRequest{Key: fmt.Sprint("key-", i)}
		for range 10 {
			limiter.When(k)
		}
		spread[limiter.When(k)] = true
	}
	if len(spread) < 10 {
		t.Fatalf("20 keys failing together retry at only %d distinct times: no jitter", len(spread))
	}
}

// What stripPod drops is never read: every function that reads a pod's
// status answers the same for a full pod and its stripped copy, and what
// it keeps of the metadata is what the marks and selectors use.
func TestStripPodKeepsWhatIsRead(t *testing.T) {
	at := func(s int) metav1.Time { return metav1.NewTime(time.Date(2026, 11, 23, 10, 0, s, 0, time.UTC)) }
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(3)}}
	full := func(phase corev1.PodPhase, states ...corev1.ContainerState) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name: "p", Namespace: "ns", UID: "u", Labels: map[string]string{"app": "x"},
				Annotations: map[string]string{"kubectl.kubernetes.io/restartedAt": "now", "big": string(make([]byte, 4096))},
			},
			Spec: corev1.PodSpec{NodeName: "n", InitContainers: []corev1.Container{{Name: "sidecar", Image: "envoy", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}},
			Status: corev1.PodStatus{
				Phase: phase,
				Conditions: []corev1.PodCondition{
					{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes are available", LastTransitionTime: at(1)},
					{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: at(2)},
					{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", Message: "containers with unready status: [main]", LastTransitionTime: at(7)},
					{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", LastTransitionTime: at(5)},
				},
			},
		}
		setMarks(p, "l", "u:0", 3)
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "sidecar", State: running, Image: "envoy", RestartCount: 1,
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", StartedAt: at(2), FinishedAt: at(3)}}}}
		for i, s := range states {
			name := fmt.Sprint("c", i)
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: name, Image: "busybox", Command: []string{"sleep", "1"}})
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: name, State: s, Image: "busybox", ImageID: "sha256:abc", ContainerID: "containerd://x", RestartCount: 2,
			})
		}
		if len(states) == 0 {
			p.Spec.Containers = []corev1.Container{{Name: "main", Image: "busybox"}}
		}
		return p
	}
	scheduled := func(p *corev1.Pod) *corev1.Pod {
		p.Status.Conditions[0] = corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: at(1)}
		return p
	}
	waiting := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "back-off pulling image"}}
	crashing := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off restarting"}}
	done := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", Message: "bye", StartedAt: at(4), FinishedAt: at(9)}}
	deleting := func(p *corev1.Pod) *corev1.Pod {
		p.DeletionTimestamp = &metav1.Time{Time: at(8).Time}
		return p
	}
	for name, pod := range map[string]*corev1.Pod{
		"pending":   full(corev1.PodPending),
		"pulling":   full(corev1.PodPending, waiting),
		"running":   full(corev1.PodRunning, running, running),
		"scheduled": scheduled(full(corev1.PodRunning, running)),
		"one done":  full(corev1.PodRunning, running, done),
		"all done":  full(corev1.PodRunning, done, done),
		"succeeded": full(corev1.PodSucceeded, done),
		"crashing":  full(corev1.PodRunning, crashing),
		"deleting":  deleting(full(corev1.PodRunning, done, done)),
	} {
		got, err := stripPod(pod)
		if err != nil {
			t.Fatal(err)
		}
		s := got.(*corev1.Pod)
		if again, _ := stripPod(s); again != s {
			t.Errorf("%s: stripping a stripped pod copied it again", name)
		}
		if decide.Stopped(s) != decide.Stopped(pod) || decide.Started(s) != decide.Started(pod) || decide.WhyNotStarted(s) != decide.WhyNotStarted(pod) ||
			!decide.StopTime(s).Equal(decide.StopTime(pod)) || !decide.MarkedAt(s, "l").Equal(decide.MarkedAt(pod, "l")) || !decide.LastMarked(s).Equal(decide.LastMarked(pod)) ||
			decide.Restarting(s) != decide.Restarting(pod) || !decide.MarkedBy(s, "l") || !carriesMarks(s, "l") {
			t.Errorf("%s: the stripped pod reads differently: stopped %v/%v, started %v/%v, why %q/%q, stop time %v/%v, restarting %q/%q",
				name, decide.Stopped(s), decide.Stopped(pod), decide.Started(s), decide.Started(pod), decide.WhyNotStarted(s), decide.WhyNotStarted(pod), decide.StopTime(s), decide.StopTime(pod), decide.Restarting(s), decide.Restarting(pod))
		}
		if len(s.Annotations) != 3 || s.Spec.Containers[0].Image != "" || len(s.Status.Conditions) > 2 || s.Status.Conditions[0].Message != "" || s.Labels["app"] != "x" {
			t.Errorf("%s: kept annotations %v, containers %v, conditions %+v, labels %v",
				name, s.Annotations, s.Spec.Containers, s.Status.Conditions, s.Labels)
		}
	}
}

// A lock is indexed by one label its selector requires, so the pods it
// selects, which all carry that label, find it by their own labels; a lock
// whose selector requires no single label is found by every pod.
func TestSelectsIndexValues(t *testing.T) {
	lock := func(name string, sel locksv1.PodSelector) *locksv1.DistributedLock {
		return &locksv1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name)},
			Spec: locksv1.DistributedLockSpec{Candidates: &sel}}
	}
	req := func(key string, op metav1.LabelSelectorOperator, values ...locksv1.LabelValue) locksv1.LabelRequirement {
		return locksv1.LabelRequirement{Key: key, Operator: op, Values: values}
	}
	for _, tc := range []struct {
		name string
		sel  locksv1.PodSelector
		want []string
	}{
		{"matchLabels", locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"b": "2", "a": "1"}}, []string{"a=1"}},
		{"In one value", locksv1.PodSelector{MatchExpressions: []locksv1.LabelRequirement{req("a", metav1.LabelSelectorOpIn, "1")}}, []string{"a=1"}},
		{"In two values", locksv1.PodSelector{MatchExpressions: []locksv1.LabelRequirement{req("a", metav1.LabelSelectorOpIn, "1", "2")}}, []string{anyLabels}},
		{"Exists and NotIn", locksv1.PodSelector{MatchExpressions: []locksv1.LabelRequirement{
			req("a", metav1.LabelSelectorOpExists), req("b", metav1.LabelSelectorOpNotIn, "x")}}, []string{anyLabels}},
		{"Exists and a label", locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"b": "2"},
			MatchExpressions: []locksv1.LabelRequirement{req("a", metav1.LabelSelectorOpExists)}}, []string{"b=2"}},
		{"empty: selects nothing", locksv1.PodSelector{}, nil},
	} {
		l := lock(strings.ReplaceAll(tc.name, " ", "-"), tc.sel)
		if got := selectsIndexValues(l); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
		for _, labels := range []map[string]string{{"a": "1", "b": "2"}, {"a": "2", "b": "2"}} {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: labels}}
			if selects(l, pod) && !slices.ContainsFunc(append(podLabelPairs(pod), anyLabels), func(v string) bool { return slices.Contains(tc.want, v) }) {
				t.Errorf("%s: selects pod %v, which does not find it by its labels", tc.name, labels)
			}
		}
	}
}
