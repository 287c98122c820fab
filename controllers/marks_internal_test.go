package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// markPods skips the pods carriesMarks says have nothing of the lock's, so
// it must agree with clearMarks: a pod it passes over is one clearMarks
// leaves unchanged, and each single mark, even an empty one, is seen.
func TestCarriesMarksAgreesWithClearMarks(t *testing.T) {
	const lock = "db"
	base := func() *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{"app": "x", locksv1.HolderLabelFor("other"): "true"},
			Annotations: map[string]string{
				locksv1.OwnerAnnotationPrefix + "other": "u:0", "note": "kept",
			},
		}, Spec: corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: locksv1.GateFor(lock)}}}}
	}
	cases := map[string]func(*corev1.Pod){
		"no marks of the lock":   func(*corev1.Pod) {},
		"no labels, annotations": func(p *corev1.Pod) { p.Labels, p.Annotations = nil, nil },
		"holder label":           func(p *corev1.Pod) { p.Labels[locksv1.HolderLabelFor(lock)] = "true" },
		"empty holder label":     func(p *corev1.Pod) { p.Labels[locksv1.HolderLabelFor(lock)] = "" },
		"owner annotation":       func(p *corev1.Pod) { p.Annotations[locksv1.OwnerAnnotationPrefix+lock] = "u:0" },
		"token annotation only":  func(p *corev1.Pod) { p.Annotations[locksv1.TokenAnnotationPrefix+lock] = "7" },
		"since annotation only":  func(p *corev1.Pod) { p.Annotations[locksv1.SinceAnnotationPrefix+lock] = "" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			pod := base()
			mutate(pod)
			cleared := pod.DeepCopy()
			clearMarks(cleared, lock)
			changes := !equality.Semantic.DeepEqual(pod, cleared)
			if got := carriesMarks(pod, lock); got != changes {
				t.Errorf("carriesMarks = %v, but clearMarks changes the pod: %v", got, changes)
			}
		})
	}
}
