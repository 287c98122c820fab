// Package why explains why a pod waits behind lockwarden's scheduling
// gates, from what the API server shows: the pod's gates and marks, and the
// statuses of the locks it names. It is `lockwarden why`'s engine.
package why

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Explain says, one line a lock, why the pod waits: for each lock whose gate
// it carries, or that it names or holds, the lock's key, who holds it, the
// pod's place in the queue or what holds it back, and what is
// misconfigured; then any other controller's gate.
func Explain(ctx context.Context, c client.Reader, namespace, name string) (string, error) {
	pod := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, pod); err != nil {
		return "", err
	}
	var b strings.Builder
	gated, foreign := locksv1.SplitGates(pod.Spec.SchedulingGates)
	switch {
	case stopped(pod):
		fmt.Fprintf(&b, "pod %s has stopped (phase %s): it waits for nothing\n", pod.Name, pod.Status.Phase)
	case len(gated) == 0 && len(foreign) == 0:
		fmt.Fprintf(&b, "pod %s carries no scheduling gate: it is free to run\n", pod.Name)
	default:
		fmt.Fprintf(&b, "pod %s waits behind %d scheduling gate(s)\n", pod.Name, len(gated)+len(foreign))
	}
	for _, lock := range lockNames(pod, gated) {
		line, err := explainLock(ctx, c, pod, lock, slices.Contains(gated, lock))
		if err != nil {
			return "", err
		}
		b.WriteString(line + "\n")
	}
	for _, g := range foreign {
		fmt.Fprintf(&b, "  gate %s: another controller's; lockwarden grants the pod no lock until it is gone\n", g)
	}
	return b.String(), nil
}

// explainLock is the line about one lock.
func explainLock(ctx context.Context, c client.Reader, pod *corev1.Pod, name string, gated bool) (string, error) {
	l := &locksv1.DistributedLock{}
	prefix := fmt.Sprintf("  lock %s", name)
	if err := c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, l); apierrors.IsNotFound(err) {
		if gated {
			return prefix + fmt.Sprintf(": MISCONFIGURED: no DistributedLock %q in namespace %s, so its gate %s is never lifted; create the lock or remove the gate",
				name, pod.Namespace, locksv1.GateFor(name)), nil
		}
		return prefix + ": no such DistributedLock", nil
	} else if err != nil {
		return "", err
	}
	st := l.Status
	prefix += fmt.Sprintf(" (key %s)", st.Key)
	var parts []string
	if c := meta.FindStatusCondition(st.Conditions, locksv1.ConditionReady); c != nil && c.Status != "True" {
		parts = append(parts, fmt.Sprintf("NOT READY (%s): %s", c.Reason, c.Message))
	}
	switch h := st.Holder; {
	case h != nil && h.PodUID == string(pod.UID):
		how := "its in-pod client holds it"
		if h.GrantedByController {
			how = "granted to it"
		}
		parts = append(parts, fmt.Sprintf("%s, fencing token %d, since %s", how, h.Token, h.Since.UTC().Format("2006-01-02T15:04:05Z")))
	case h != nil:
		parts = append(parts, fmt.Sprintf("held by pod %s (fencing token %d)", h.PodName, h.Token))
	case meta.IsStatusConditionTrue(st.Conditions, locksv1.ConditionHeld):
		parts = append(parts, "held by an owner outside this namespace")
	default:
		parts = append(parts, "free")
	}
	if i := slices.Index(st.Waiting, pod.Name); i >= 0 {
		parts = append(parts, fmt.Sprintf("waiting: %s of %d in line", ordinal(i+1), len(st.Waiting)))
	}
	if i := slices.IndexFunc(st.Blocked, func(p locksv1.BlockedPod) bool { return p.PodName == pod.Name }); i >= 0 {
		parts = append(parts, "not in line: "+st.Blocked[i].Reason)
	}
	return prefix + ": " + strings.Join(parts, "; "), nil
}

// lockNames are the locks the pod is gated by, names, or is marked by,
// each once, gates first.
func lockNames(pod *corev1.Pod, gated []string) []string {
	names := slices.Clone(gated)
	add := func(name string) {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	for _, n := range locksv1.NamedLocks(pod.Labels, pod.Annotations) {
		add(n)
	}
	var marked []string
	for k := range pod.Labels {
		if n, ok := strings.CutPrefix(k, locksv1.HolderLabelPrefix); ok {
			marked = append(marked, n)
		}
	}
	slices.Sort(marked)
	for _, n := range marked {
		add(n)
	}
	return names
}

func stopped(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

func ordinal(n int) string {
	switch {
	case n%100 >= 11 && n%100 <= 13:
		return fmt.Sprintf("%dth", n)
	case n%10 == 1:
		return fmt.Sprintf("%dst", n)
	case n%10 == 2:
		return fmt.Sprintf("%dnd", n)
	case n%10 == 3:
		return fmt.Sprintf("%drd", n)
	}
	return fmt.Sprintf("%dth", n)
}
