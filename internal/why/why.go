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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Report is why a pod waits, as Inspect finds it; String is its text, and
// `lockwarden why -o json|yaml` prints its fields.
type Report struct {
	Pod       string          `json:"pod"`
	Namespace string          `json:"namespace"`
	Phase     corev1.PodPhase `json:"phase,omitempty"`
	// Stopped: the pod has ended (Succeeded or Failed) and waits for
	// nothing.
	Stopped bool `json:"stopped"`
	// Gates is how many scheduling gates the pod carries, lockwarden's and
	// other controllers'.
	Gates int `json:"gates"`
	// Locks are the locks whose gate the pod carries, that it names, or
	// whose holder mark it carries, each once, gates first.
	Locks []LockReport `json:"locks"`
	// OtherGates are other controllers' gates: lockwarden grants the pod no
	// lock until they are gone.
	OtherGates []string `json:"otherGates,omitempty"`
}

// LockReport is what one lock means for the pod.
type LockReport struct {
	Name string `json:"name"`
	// Gated: the pod carries this lock's gate.
	Gated bool `json:"gated"`
	// Found: the DistributedLock exists in the pod's namespace. A gate of a
	// missing lock is never lifted (Misconfigured says so).
	Found         bool   `json:"found"`
	Misconfigured string `json:"misconfigured,omitempty"`
	Key           string `json:"key,omitempty"`
	// NotReady is the lock's Ready condition when it is not True.
	NotReady *metav1.Condition `json:"notReady,omitempty"`
	// Holder is who holds the lock, by the lock's status; nil when it is
	// free or held by an owner outside the namespace (HeldElsewhere).
	Holder        *Holder `json:"holder,omitempty"`
	HeldElsewhere bool    `json:"heldElsewhere,omitempty"`
	// Position is the pod's place in line (1 is next), and Waiting the
	// line's length; 0 when the pod is not in line.
	Position int `json:"position,omitempty"`
	Waiting  int `json:"waiting,omitempty"`
	// Blocked is why the pod is not in line, if the lock says it is held
	// back.
	Blocked string `json:"blocked,omitempty"`
}

// Holder is a lock's holding pod.
type Holder struct {
	Pod string `json:"pod"`
	// ThisPod: the pod asked about is the holder.
	ThisPod bool `json:"thisPod"`
	// GrantedByController: the controller took the lock for the pod;
	// otherwise its in-pod client holds it.
	GrantedByController bool        `json:"grantedByController"`
	Token               int64       `json:"token"`
	Since               metav1.Time `json:"since"`
}

// Explain says, one line a lock, why the pod waits: for each lock whose gate
// it carries, or that it names or holds, the lock's key, who holds it, the
// pod's place in the queue or what holds it back, and what is
// misconfigured; then any other controller's gate.
func Explain(ctx context.Context, c client.Reader, namespace, name string) (string, error) {
	r, err := Inspect(ctx, c, namespace, name)
	if err != nil {
		return "", err
	}
	return r.String(), nil
}

// Inspect reads the pod and the locks it carries, names or holds, and
// returns what they say about its wait.
func Inspect(ctx context.Context, c client.Reader, namespace, name string) (*Report, error) {
	pod := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, pod); err != nil {
		return nil, err
	}
	gated, foreign := locksv1.SplitGates(pod.Spec.SchedulingGates)
	r := &Report{
		Pod:        pod.Name,
		Namespace:  pod.Namespace,
		Phase:      pod.Status.Phase,
		Stopped:    stopped(pod),
		Gates:      len(gated) + len(foreign),
		Locks:      []LockReport{},
		OtherGates: foreign,
	}
	for _, lock := range lockNames(pod, gated) {
		l, err := inspectLock(ctx, c, pod, lock, slices.Contains(gated, lock))
		if err != nil {
			return nil, err
		}
		r.Locks = append(r.Locks, l)
	}
	return r, nil
}

// inspectLock is what the lock name means for the pod.
func inspectLock(ctx context.Context, c client.Reader, pod *corev1.Pod, name string, gated bool) (LockReport, error) {
	r := LockReport{Name: name, Gated: gated}
	l := &locksv1.DistributedLock{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, l); apierrors.IsNotFound(err) {
		if gated {
			r.Misconfigured = fmt.Sprintf("no DistributedLock %q in namespace %s, so its gate %s is never lifted; create the lock or remove the gate",
				name, pod.Namespace, locksv1.GateFor(name))
		}
		return r, nil
	} else if err != nil {
		return r, err
	}
	st := l.Status
	r.Found, r.Key = true, st.Key
	if c := meta.FindStatusCondition(st.Conditions, locksv1.ConditionReady); c != nil && c.Status != metav1.ConditionTrue {
		r.NotReady = c
	}
	switch h := st.Holder; {
	case h != nil:
		r.Holder = &Holder{Pod: h.PodName, ThisPod: h.PodUID == string(pod.UID), GrantedByController: h.GrantedByController, Token: h.Token, Since: h.Since}
	case meta.IsStatusConditionTrue(st.Conditions, locksv1.ConditionHeld):
		r.HeldElsewhere = true
	}
	if i := slices.Index(st.Waiting, pod.Name); i >= 0 {
		r.Position, r.Waiting = i+1, len(st.Waiting)
	}
	if i := slices.IndexFunc(st.Blocked, func(p locksv1.BlockedPod) bool { return p.PodName == pod.Name }); i >= 0 {
		r.Blocked = st.Blocked[i].Reason
	}
	return r, nil
}

// String is the report as `lockwarden why` prints it: a line about the pod,
// one a lock, then one for each other controller's gate.
func (r *Report) String() string {
	var b strings.Builder
	switch {
	case r.Stopped:
		fmt.Fprintf(&b, "pod %s has stopped (phase %s): it waits for nothing\n", r.Pod, r.Phase)
	case r.Gates == 0:
		fmt.Fprintf(&b, "pod %s carries no scheduling gate: it is free to run\n", r.Pod)
	default:
		fmt.Fprintf(&b, "pod %s waits behind %d scheduling gate(s)\n", r.Pod, r.Gates)
	}
	for _, l := range r.Locks {
		b.WriteString(l.String() + "\n")
	}
	for _, g := range r.OtherGates {
		fmt.Fprintf(&b, "  gate %s: another controller's; lockwarden grants the pod no lock until it is gone\n", g)
	}
	return b.String()
}

// String is the report's line about the lock.
func (l LockReport) String() string {
	prefix := fmt.Sprintf("  lock %s", l.Name)
	switch {
	case l.Misconfigured != "":
		return prefix + ": MISCONFIGURED: " + l.Misconfigured
	case !l.Found:
		return prefix + ": no such DistributedLock"
	}
	prefix += fmt.Sprintf(" (key %s)", l.Key)
	var parts []string
	if c := l.NotReady; c != nil {
		parts = append(parts, fmt.Sprintf("NOT READY (%s): %s", c.Reason, c.Message))
	}
	switch h := l.Holder; {
	case h != nil && h.ThisPod:
		how := "its in-pod client holds it"
		if h.GrantedByController {
			how = "granted to it"
		}
		parts = append(parts, fmt.Sprintf("%s, fencing token %d, since %s", how, h.Token, h.Since.UTC().Format("2006-01-02T15:04:05Z")))
	case h != nil:
		parts = append(parts, fmt.Sprintf("held by pod %s (fencing token %d)", h.Pod, h.Token))
	case l.HeldElsewhere:
		parts = append(parts, "held by an owner outside this namespace")
	default:
		parts = append(parts, "free")
	}
	if l.Position > 0 {
		parts = append(parts, fmt.Sprintf("waiting: %s of %d in line", ordinal(l.Position), l.Waiting))
	}
	if l.Blocked != "" {
		parts = append(parts, "not in line: "+l.Blocked)
	}
	return prefix + ": " + strings.Join(parts, "; ")
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
