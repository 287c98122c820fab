package controllers_test

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// The model's kubelet. TestModel plays the kubelet of every node: it decides
// what each container of a pod does (start, exit, be restarted in place, be
// killed) and keeps that decision in a modelPod, and only then writes the
// pod's status to the API server, as a kubelet would write it. The checker
// judges whether a pod runs from the modelPod, never from the status it
// wrote, and never with the controller's code.
//
// What it writes follows the kubelet of Kubernetes v1.36
// (pkg/kubelet/kubelet_pods.go: getPhase, convertToAPIContainerStatuses;
// pkg/kubelet/status/status_manager.go: TerminatePod), with the feature
// ContainerRestartRules on, as it is by default since v1.35:
//   - a container that exits under restartPolicy Always, or with a non-zero
//     code under OnFailure, is restarted in the same pod: until then its
//     status shows it Terminated, or Waiting (CrashLoopBackOff) with its last
//     termination, then Running with restartCount + 1; the phase stays
//     Running throughout;
//   - a native sidecar (an init container with restartPolicy Always) starts
//     before the next init container and the app containers, is restarted
//     whenever it exits, and is stopped once the app containers are done for
//     good; a stopped sidecar does not count in the phase;
//   - a regular init container runs to completion before the next one starts;
//     one that fails is restarted, unless the pod's policy is Never: then the
//     pod fails;
//   - a pod whose containers are all done for good reaches its terminal phase
//     (Succeeded if every app container exited 0, else Failed);
//   - every status it writes carries status.observedGeneration, the pod's
//     generation as the kubelet last saw it (GA since v1.35; a graceful
//     deletion bumps the generation), and stamps container states with its
//     node's clock, which may be a second or two off the API server's;
//   - a kubelet learns of a pod's deletion through its watch, at the same
//     step or a later one: until then it starts and restarts containers as
//     before;
//   - a pod being deleted keeps running through its grace period (its
//     containers may exit, and are not restarted), then the kubelet kills
//     what still runs, app containers first and sidecars after them, and
//     reports the pod terminal (TerminatePod: each container it cannot show
//     terminated is reported terminated with exit code 137, and the phase is
//     Failed unless it is already terminal) before it removes the object. An
//     older kubelet, which a pod runs on at random, leaves the phase as
//     getPhase computes it without the terminal flag: Running, under
//     Always, with every container terminated; nor does it write
//     observedGeneration;
//   - a node that is lost reports nothing more: its pods' containers count as
//     running until the pod object is force-deleted, or the pod garbage
//     collector (after the administrator's out-of-service taint) marks it
//     Failed.

// containerKind is what a container of a model pod is.
type containerKind int

const (
	initKind    containerKind = iota // a regular init container
	sidecarKind                      // an init container with restartPolicy Always
	appKind
)

// containerState is what the model kubelet has done with a container.
type containerState int

const (
	notStarted containerState = iota // never started: Waiting
	isRunning
	hasExited // its last run exited; shown Terminated
	backOff   // waiting to be restarted: Waiting (CrashLoopBackOff)
)

type modelContainer struct {
	name     string
	kind     containerKind
	state    containerState
	exitCode int32 // of the last run, once it exited
	restarts int32
	// startedAt and finishedAt are the last run's.
	startedAt, finishedAt metav1.Time
	// last is the run before the current one, once restarted.
	last *corev1.ContainerStateTerminated
}

// modelPod is a pod as the model's kubelet, scheduler and other
// controllers see it, and what the checker remembers of it.
type modelPod struct {
	uid      types.UID
	ns, name string
	group    string
	spec     corev1.PodSpec // as created
	cs       []*modelContainer
	// lockGates name the locks whose gate the pod was created with
	// (possibly locks that do not exist); foreign is whether it still
	// carries the gate of another controller, which only the model lifts.
	lockGates []string
	foreign   bool
	// oldKubelet: the pod's node runs a kubelet that leaves the phase
	// Running once it has killed the containers of a pod being deleted.
	oldKubelet bool
	node       string
	// skew is how far its node's clock, which stamps the container
	// states, is off the API server's.
	skew time.Duration
	lost bool // its node stopped reporting
	// deleting: the pod has a deletionTimestamp. terminating: its kubelet
	// has seen that (a kubelet learns of a deletion through its watch, a
	// moment later; that of a lost node never does). Until then it starts
	// and restarts containers as before.
	deleting, terminating bool
	// seenGeneration is the pod's generation as its kubelet last saw it,
	// which it reports as status.observedGeneration (a graceful deletion
	// bumps the generation).
	seenGeneration int64
	// terminal: the model has stopped every container for good. phase is
	// the terminal phase the API server was told, if any.
	terminal bool
	phase    corev1.PodPhase
	gone     bool
	// podGCFailed: the pod garbage collector marked it Failed, and will
	// remove it.
	podGCFailed bool
	// guarded maps the name of each lock that lifted the pod's gate to
	// the key it named then: from that step on, the pod is a guarded pod of
	// that key until it stops for good.
	guarded map[string]string
	history []string
}

// running is the oracle of "this pod runs": a container the model started
// and has not stopped, or any pod of a lost node that has not been
// force-deleted or failed by the pod garbage collector.
func (p *modelPod) running() bool {
	if p.gone || p.terminal {
		return false
	}
	return p.lost || slices.ContainsFunc(p.cs, func(c *modelContainer) bool { return c.state == isRunning })
}

// stoppedForGood reports whether no container of the pod can run again.
func (p *modelPod) stoppedForGood() bool { return p.gone || p.terminal }

// reportedStopped reports whether the API server was told that the pod
// stopped in the way every kubelet tells it: a terminal phase, or the
// object gone. (An older kubelet's "phase Running, every container
// terminated" on a pod being deleted is not counted: the checker then waits
// for the object to go before it asks for a release.)
func (p *modelPod) reportedStopped() bool {
	return p.gone || p.phase == corev1.PodSucceeded || p.phase == corev1.PodFailed
}

func (p *modelPod) keys() []string {
	var keys []string
	for _, k := range p.guarded {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func (p *modelPod) note(step int, format string, args ...any) {
	p.history = append(p.history, fmt.Sprintf("step %d: %s", step, fmt.Sprintf(format, args...)))
	if len(p.history) > 40 {
		p.history = p.history[len(p.history)-40:]
	}
}

// describe is the pod's model state, for failure messages.
func (p *modelPod) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s/%s (uid %s, group %s, restartPolicy %s, node %s, its clock %+v", p.ns, p.name, p.uid, p.group, p.spec.RestartPolicy, p.node, p.skew)
	for _, f := range []struct {
		on   bool
		name string
	}{{p.lost, "lost"}, {p.deleting, "deleting"}, {p.terminating, "its kubelet saw the deletion"}, {p.terminal, "terminal"}, {p.gone, "gone"}, {p.oldKubelet, "old kubelet"}, {p.foreign, "foreign gate"}} {
		if f.on {
			b.WriteString(", " + f.name)
		}
	}
	fmt.Fprintf(&b, ", lock gates %v, guarded %v)\n  containers:", p.lockGates, p.guarded)
	for _, c := range p.cs {
		fmt.Fprintf(&b, " %s[%s]=%s", c.name, [...]string{"init", "sidecar", "app"}[c.kind], c.stateString())
	}
	b.WriteString("\n  history:\n    " + strings.Join(p.history, "\n    "))
	return b.String()
}

func (c *modelContainer) stateString() string {
	switch c.state {
	case notStarted:
		return "not started"
	case isRunning:
		return fmt.Sprintf("running (restarts %d)", c.restarts)
	case hasExited:
		return fmt.Sprintf("exited %d (restarts %d)", c.exitCode, c.restarts)
	}
	return fmt.Sprintf("back-off after exit %d (restarts %d)", c.exitCode, c.restarts)
}

// newModelPodSpec draws a pod's containers and restart policy.
func newModelPodSpec(intn func(int) int) corev1.PodSpec {
	spec := corev1.PodSpec{
		RestartPolicy: []corev1.RestartPolicy{corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure, corev1.RestartPolicyAlways}[intn(3)],
		Containers:    []corev1.Container{{Name: "main", Image: "busybox"}},
	}
	if intn(3) == 0 {
		spec.Containers = append(spec.Containers, corev1.Container{Name: "helper", Image: "busybox"})
	}
	if intn(4) == 0 {
		spec.InitContainers = append(spec.InitContainers, corev1.Container{Name: "setup", Image: "busybox"})
	}
	if intn(3) == 0 {
		sidecar := corev1.Container{Name: "proxy", Image: "busybox", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}
		if intn(2) == 0 {
			spec.InitContainers = append(spec.InitContainers, sidecar)
		} else {
			spec.InitContainers = append([]corev1.Container{sidecar}, spec.InitContainers...)
		}
	}
	return spec
}

func modelContainers(spec corev1.PodSpec) []*modelContainer {
	var cs []*modelContainer
	for _, c := range spec.InitContainers {
		kind := initKind
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			kind = sidecarKind
		}
		cs = append(cs, &modelContainer{name: c.Name, kind: kind})
	}
	for _, c := range spec.Containers {
		cs = append(cs, &modelContainer{name: c.Name, kind: appKind})
	}
	return cs
}

// restartsApp reports whether the pod's policy restarts an app container
// (or a failed regular init container) that exited with the code.
func (p *modelPod) restartsApp(code int32) bool {
	switch p.spec.RestartPolicy {
	case corev1.RestartPolicyAlways:
		return true
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return false
}

// finishing reports whether the kubelet has given up on the pod's app
// containers: each one exited and its policy does not restart it, or a
// regular init container failed under restartPolicy Never. It then stops
// the sidecars and restarts nothing.
func (p *modelPod) finishing() bool {
	apps := 0
	for _, c := range p.cs {
		switch {
		case c.kind == initKind && c.state == hasExited && c.exitCode != 0 && !p.restartsApp(c.exitCode):
			return true
		case c.kind == appKind && c.state == hasExited && !p.restartsApp(c.exitCode):
			apps++
		}
	}
	return apps == len(p.spec.Containers)
}

// awaitsRestart reports whether the kubelet will restart the container in
// place: it exited (or backs off) and the pod is not being stopped.
func (p *modelPod) awaitsRestart(c *modelContainer) bool {
	if (c.state != hasExited && c.state != backOff) || p.terminating || p.terminal || p.lost || p.finishing() {
		return false
	}
	switch c.kind {
	case sidecarKind:
		return true
	case initKind:
		return c.exitCode != 0 && p.restartsApp(c.exitCode)
	}
	return p.restartsApp(c.exitCode)
}

// startable are the containers the kubelet starts at its next sync: the
// first init container not started yet, once every init container before
// it has completed (a regular one) or started (a sidecar); else the app
// containers not started yet.
func (p *modelPod) startable() []*modelContainer {
	if p.node == "" || p.lost || p.terminating || p.terminal || p.finishing() {
		return nil
	}
	var apps []*modelContainer
	for _, c := range p.cs {
		switch {
		case c.kind != appKind && c.state == notStarted:
			return []*modelContainer{c}
		case c.kind == initKind && !(c.state == hasExited && c.exitCode == 0):
			return nil // it runs, or waits to be restarted
		case c.kind == appKind && c.state == notStarted:
			apps = append(apps, c)
		}
	}
	return apps
}

func (c *modelContainer) start(now metav1.Time) {
	if c.state == hasExited || c.state == backOff {
		c.last = c.terminated()
		c.restarts++
	}
	c.state, c.startedAt = isRunning, now
}

func (c *modelContainer) exit(code int32, now metav1.Time) {
	c.state, c.exitCode, c.finishedAt = hasExited, code, now
}

// terminated is the container's last run, once it exited.
func (c *modelContainer) terminated() *corev1.ContainerStateTerminated {
	reason := "Completed"
	if c.exitCode != 0 {
		reason = "Error"
	}
	return &corev1.ContainerStateTerminated{
		ExitCode: c.exitCode, Reason: reason, StartedAt: c.startedAt, FinishedAt: c.finishedAt,
		ContainerID: fmt.Sprintf("containerd://%s-%d", c.name, c.restarts),
	}
}

// runningContainers are the pod's running containers, the app containers
// first and the sidecars last, in the order the kubelet stops them.
func (p *modelPod) runningContainers() []*modelContainer {
	var out []*modelContainer
	for _, kind := range []containerKind{appKind, initKind, sidecarKind} {
		for i := len(p.cs) - 1; i >= 0; i-- {
			if c := p.cs[i]; c.kind == kind && c.state == isRunning {
				out = append(out, c)
			}
		}
	}
	return out
}

// status is the pod status the kubelet writes for the model's state.
func (p *modelPod) status(scheduledAt metav1.Time) corev1.PodStatus {
	waiting := "ContainerCreating"
	if len(p.spec.InitContainers) > 0 {
		waiting = "PodInitializing"
	}
	var st corev1.PodStatus
	initialized := false
	for _, c := range p.cs {
		s := corev1.ContainerStatus{Name: c.name, Image: "busybox", ImageID: "docker.io/library/busybox@sha256:0", RestartCount: c.restarts}
		if c.last != nil {
			s.LastTerminationState.Terminated = c.last.DeepCopy()
		}
		switch c.state {
		case notStarted:
			s.State.Waiting = &corev1.ContainerStateWaiting{Reason: waiting}
		case isRunning:
			s.State.Running = &corev1.ContainerStateRunning{StartedAt: c.startedAt}
			s.Ready, s.Started = true, ptr.To(true)
			s.ContainerID = fmt.Sprintf("containerd://%s-%d", c.name, c.restarts)
		case hasExited:
			s.State.Terminated = c.terminated()
			s.Started, s.ContainerID = ptr.To(false), s.State.Terminated.ContainerID
		case backOff:
			s.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
				Message: fmt.Sprintf("back-off restarting failed container %s", c.name)}
			s.LastTerminationState.Terminated = c.terminated()
			s.Started = ptr.To(false)
		}
		if c.kind == appKind {
			st.ContainerStatuses = append(st.ContainerStatuses, s)
			initialized = initialized || c.state != notStarted
		} else {
			st.InitContainerStatuses = append(st.InitContainerStatuses, s)
		}
	}
	all := append(slices.Clone(st.ContainerStatuses), st.InitContainerStatuses...)
	switch {
	case p.phase != "":
		st.Phase = p.phase // a terminal phase is never left
	case p.terminal && p.terminating && !p.oldKubelet:
		st.Phase = kubeletPhase(&p.spec, all, true, initialized)
	default:
		st.Phase = kubeletPhase(&p.spec, all, false, initialized)
	}
	if p.terminal && !p.oldKubelet {
		terminatePod(&st, len(p.spec.InitContainers) == 0 || initialized)
	}
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, LastTransitionTime: scheduledAt}
		if ok {
			c.Status = corev1.ConditionTrue
		}
		return c
	}
	ready := st.Phase == corev1.PodRunning && !slices.ContainsFunc(st.ContainerStatuses, func(s corev1.ContainerStatus) bool { return !s.Ready })
	st.Conditions = []corev1.PodCondition{
		cond(corev1.PodScheduled, true),
		cond(corev1.PodInitialized, initialized),
		cond(corev1.ContainersReady, ready),
		cond(corev1.PodReady, ready),
	}
	st.StartTime = &scheduledAt
	if !p.oldKubelet { // older kubelets predate status.observedGeneration
		st.ObservedGeneration = p.seenGeneration
	}
	return st
}

// terminatePod is what the kubelet's status manager does to the status of
// a pod it has terminated (TerminatePod): once the pod has initialized,
// every app container not shown terminated is reported terminated with
// exit code 137; so is every init container but the suffix that never
// started; and a phase that is not terminal becomes Failed.
func terminatePod(st *corev1.PodStatus, initialized bool) {
	unknown := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		Reason: "ContainerStatusUnknown", Message: "The container could not be located when the pod was terminated", ExitCode: 137,
	}}
	if initialized {
		for i := range st.ContainerStatuses {
			if st.ContainerStatuses[i].State.Terminated == nil {
				st.ContainerStatuses[i].State = unknown
			}
		}
	}
	tried := len(st.InitContainerStatuses)
	for tried > 1 {
		if s := st.InitContainerStatuses[tried-1]; s.State.Waiting == nil || s.LastTerminationState.Terminated != nil {
			break
		}
		tried--
	}
	for i := range tried {
		if st.InitContainerStatuses[i].State.Terminated == nil {
			st.InitContainerStatuses[i].State = unknown
		}
	}
	if st.Phase != corev1.PodSucceeded && st.Phase != corev1.PodFailed {
		st.Phase = corev1.PodFailed
	}
}

// kubeletPhase is the kubelet's getPhase (pkg/kubelet/kubelet_pods.go,
// v1.36) with ContainerRestartRules on, for pods whose only container
// restart policies are the sidecars' Always: whether an exited container
// is restarted is the pod's restartPolicy's decision.
func kubeletPhase(spec *corev1.PodSpec, info []corev1.ContainerStatus, podIsTerminal, podHasInitialized bool) corev1.PodPhase {
	statusOf := func(name string) (corev1.ContainerStatus, bool) {
		i := slices.IndexFunc(info, func(s corev1.ContainerStatus) bool { return s.Name == name })
		if i < 0 {
			return corev1.ContainerStatus{}, false
		}
		return info[i], true
	}
	restarts := func(c corev1.Container, code int32) bool {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			return true
		}
		switch spec.RestartPolicy {
		case corev1.RestartPolicyOnFailure:
			return code != 0
		case corev1.RestartPolicyNever:
			return false
		}
		return true
	}
	sidecar := func(c corev1.Container) bool {
		return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
	}
	pendingRestartableInit, pendingRegularInit, failedInitNotRestartable := 0, 0, 0
	for _, c := range spec.InitContainers {
		if sidecar(c) {
			continue
		}
		s, ok := statusOf(c.Name)
		switch {
		case !ok, s.State.Running != nil:
			pendingRegularInit++
		case s.State.Terminated != nil:
			if code := s.State.Terminated.ExitCode; code != 0 && !restarts(c, code) {
				failedInitNotRestartable++
			}
		case s.State.Waiting != nil && s.LastTerminationState.Terminated != nil:
			if code := s.LastTerminationState.Terminated.ExitCode; code != 0 && !restarts(c, code) {
				failedInitNotRestartable++
			}
		default:
			pendingRegularInit++
		}
	}
	unknown, running, waiting, stopped, stoppedNotRestartable, succeeded := 0, 0, 0, 0, 0, 0
	for _, c := range spec.InitContainers {
		if !sidecar(c) {
			continue
		}
		s, ok := statusOf(c.Name)
		switch {
		case !ok:
			unknown++
		case s.State.Running != nil:
			if s.Started == nil || !*s.Started {
				pendingRestartableInit++
			}
			running++
		case s.State.Terminated != nil:
		case s.State.Waiting != nil:
			if s.LastTerminationState.Terminated == nil {
				pendingRestartableInit++
				waiting++
			}
		default:
			pendingRestartableInit++
			unknown++
		}
	}
	for _, c := range spec.Containers {
		s, ok := statusOf(c.Name)
		switch {
		case !ok:
			unknown++
		case s.State.Running != nil:
			running++
		case s.State.Terminated != nil:
			stopped++
			code := s.State.Terminated.ExitCode
			if !restarts(c, code) {
				stoppedNotRestartable++
			}
			if code == 0 {
				succeeded++
			}
		case s.State.Waiting != nil:
			if s.LastTerminationState.Terminated != nil {
				stopped++
				if !restarts(c, s.LastTerminationState.Terminated.ExitCode) {
					stoppedNotRestartable++
				}
			} else {
				waiting++
			}
		default:
			unknown++
		}
	}
	if failedInitNotRestartable > 0 {
		return corev1.PodFailed
	}
	switch {
	case pendingRegularInit > 0 || (pendingRestartableInit > 0 && !podHasInitialized), waiting > 0:
		return corev1.PodPending
	case running > 0 && unknown == 0:
		return corev1.PodRunning
	case running == 0 && stopped > 0 && unknown == 0:
		if podIsTerminal {
			if stopped == succeeded {
				return corev1.PodSucceeded
			}
			return corev1.PodFailed
		}
		if stopped != stoppedNotRestartable {
			return corev1.PodRunning
		}
		if stopped == succeeded {
			return corev1.PodSucceeded
		}
		return corev1.PodFailed
	}
	return corev1.PodPending
}

// now is the time on the pod's node, to the second, as the API server
// keeps it: the kubelet stamps container states with it.
func (p *modelPod) now() metav1.Time {
	return metav1.NewTime(time.Now().Add(p.skew).Truncate(time.Second))
}
