package controllers

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
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
