package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/plane"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// namespace is where the story's objects live.
const namespace = "demo"

// Bounds that only keep a broken demo from hanging; they assert no timing.
const (
	waitTimeout  = 20 * time.Second
	pollInterval = 50 * time.Millisecond
)

// maxHandover is what the handover check allows, from the leader pod's
// deletion to the new holder in the lock's status.
const maxHandover = time.Second

type options struct {
	manager     string // the manager binary; "" for bin/manager
	keepRunning bool
}

// checkError is a fact of the story that did not hold.
type checkError struct {
	what, expected, got string
}

func (e *checkError) Error() string {
	return fmt.Sprintf("check failed: %s\n  expected: %s\n  got:      %s", e.what, e.expected, e.got)
}

// run plays the story, writing it to out. It returns nil only if every
// check held, and it stops everything it started before returning.
func run(ctx context.Context, out io.Writer, opts options) (err error) {
	ctrl.SetLogger(logr.Discard()) // envtest logs through controller-runtime
	began := time.Now()
	e := &env{out: out}
	d := &demo{out: out, e: e}
	defer func() {
		if err != nil {
			if ctx.Err() != nil {
				fmt.Fprintln(out, "\nInterrupted.")
			} else {
				fmt.Fprintf(out, "\nFAILED: %v\n", err)
				if tail := e.managerLogTail(30); tail != "" {
					fmt.Fprintf(out, "\nThe manager's log ends with:\n%s\n", tail)
				}
			}
		}
		fmt.Fprint(out, "\nStopping the manager, redis and the control plane... ")
		e.close()
		fmt.Fprintln(out, "done.")
	}()

	d.section("A local control plane, Redis and the controller")
	if err := startEnv(ctx, e, opts); err != nil {
		return err
	}
	d.k = &kubectl{out: out, bin: e.kubectl, dir: e.root, env: e.kubectlEnv()}
	for _, step := range []func(context.Context) error{d.leaderElection, d.guardedRun, d.handover, d.inPodClient, d.summary} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "\nAll checks passed in %.1fs.\n", time.Since(began).Seconds())
	if opts.keepRunning {
		fmt.Fprintf(out, "\nEverything keeps running. In another shell:\n  export KUBECONFIG=%s\n  %s get dlock\nPress Ctrl-C to stop.\n", e.kubeconfig, e.kubectl)
		<-ctx.Done()
	}
	return nil
}

// demo is the story's state.
type demo struct {
	out       io.Writer
	e         *env
	k         *kubectl
	n         int
	leader    string   // the first leader pod
	leaderT   int64    // its fencing token
	followers []string // the other pods of the Deployment, in the lock's order
	fresh     bool     // nothing was printed since the section header
}

func (d *demo) section(title string) {
	d.n++
	fmt.Fprintf(d.out, "\n== %d. %s ==\n\n", d.n, title)
	d.fresh = true
}

// say prints an explanation.
func (d *demo) say(lines ...string) {
	if !d.fresh {
		fmt.Fprintln(d.out)
	}
	d.fresh = false
	for _, l := range lines {
		fmt.Fprintln(d.out, l)
	}
}

// ok prints a fact that was checked.
func (d *demo) ok(format string, args ...any) {
	fmt.Fprintf(d.out, "✓ "+format+"\n", args...)
}

func (d *demo) lock(ctx context.Context, name string) (*locksv1.DistributedLock, error) {
	lock := &locksv1.DistributedLock{}
	return lock, d.k.getJSON(ctx, lock, "dlock", name)
}

func (d *demo) pod(ctx context.Context, name string) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	return pod, d.k.getJSON(ctx, pod, "pod", name)
}

// waitFor polls cond until it holds. cond describes what it observed, for
// the failure message.
func (d *demo) waitFor(ctx context.Context, what, expected string, cond func() (bool, string, error)) error {
	deadline := time.Now().Add(waitTimeout)
	var got string // what cond last observed
	for {
		done, observed, err := cond()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case err != nil:
			got = err.Error()
		case done:
			return nil
		default:
			got = observed
		}
		if time.Now().After(deadline) {
			return &checkError{what: what + fmt.Sprintf(" (waited %v)", waitTimeout), expected: expected, got: got}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollInterval):
		}
	}
}

// waitForHolder waits until the lock's status names the pod as holder, and
// the waiting list is as given.
func (d *demo) waitForHolder(ctx context.Context, lockName, pod string, waiting ...string) (*locksv1.DistributedLock, error) {
	var lock *locksv1.DistributedLock
	expected := fmt.Sprintf("holder %s, waiting %v", orNone(pod), waiting)
	err := d.waitFor(ctx, "the status of DistributedLock "+lockName, expected, func() (bool, string, error) {
		var err error
		if lock, err = d.lock(ctx, lockName); err != nil {
			return false, "", err
		}
		got := fmt.Sprintf("holder %s, waiting %v", orNone(holderName(lock)), lock.Status.Waiting)
		return got == expected, got, nil
	})
	return lock, err
}

func holderName(lock *locksv1.DistributedLock) string {
	if lock.Status.Holder == nil {
		return ""
	}
	return lock.Status.Holder.PodName
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// jobPod is the one pod of the Job named job.
func (d *demo) jobPod(ctx context.Context, job string) (*corev1.Pod, error) {
	var list corev1.PodList
	if err := d.k.getJSON(ctx, &list, "pods", "-l", "batch.kubernetes.io/job-name="+job); err != nil {
		return nil, err
	}
	if len(list.Items) != 1 {
		return nil, fmt.Errorf("job %s has %d pods, want 1", job, len(list.Items))
	}
	return &list.Items[0], nil
}

// waitForJobPod waits until the Job's pod exists and satisfies cond.
func (d *demo) waitForJobPod(ctx context.Context, job, expected string, cond func(*corev1.Pod) bool) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := d.waitFor(ctx, "the pod of Job "+job, expected, func() (bool, string, error) {
		var err error
		if pod, err = d.jobPod(ctx, job); err != nil {
			return false, "", err
		}
		return cond(pod), fmt.Sprintf("phase %s, gates %v", pod.Status.Phase, pod.Spec.SchedulingGates), nil
	})
	return pod, err
}

// runStamp is when kwok, playing the kubelet, started or stopped a pod's
// containers (the annotation holds it to the nanosecond).
func runStamp(pod *corev1.Pod, annotation string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, pod.Annotations[annotation])
	if err != nil {
		return time.Time{}, &checkError{what: "the run stamps of " + pod.Name, expected: annotation + " in RFC 3339", got: fmt.Sprint(pod.Annotations)}
	}
	return t, nil
}

// annotationsTemplate lists a pod's annotations one a line.
const annotationsTemplate = `go-template={{range $k, $v := .metadata.annotations}}{{$k}}={{$v}}{{"\n"}}{{end}}`

// checkMarks checks that pod is marked as the holder of lock with token, or
// carries no lock's marks if lock is "".
func checkMarks(pod *corev1.Pod, lock string, token int64) error {
	what := "the holder marks on pod " + pod.Name
	if lock == "" {
		var left []string
		for k, v := range pod.Labels {
			if strings.HasPrefix(k, locksv1.HolderLabelPrefix) {
				left = append(left, k+"="+v)
			}
		}
		for k, v := range pod.Annotations {
			for _, prefix := range []string{locksv1.OwnerAnnotationPrefix, locksv1.TokenAnnotationPrefix, locksv1.SinceAnnotationPrefix} {
				if strings.HasPrefix(k, prefix) {
					left = append(left, k+"="+v)
				}
			}
		}
		if len(left) > 0 {
			slices.Sort(left)
			return &checkError{what: what, expected: "none", got: strings.Join(left, ", ")}
		}
		return nil
	}
	label, tokenKey, sinceKey := locksv1.HolderLabelFor(lock), locksv1.TokenAnnotationPrefix+lock, locksv1.SinceAnnotationPrefix+lock
	want := fmt.Sprintf("label %s=true, annotations %s=%d and %s (RFC 3339)", label, tokenKey, token, sinceKey)
	got := fmt.Sprintf("label %s=%q, annotations %s=%q %s=%q", label, pod.Labels[label], tokenKey, pod.Annotations[tokenKey], sinceKey, pod.Annotations[sinceKey])
	_, sinceErr := time.Parse(time.RFC3339, pod.Annotations[sinceKey])
	if pod.Labels[label] != "true" || pod.Annotations[tokenKey] != strconv.FormatInt(token, 10) || sinceErr != nil {
		return &checkError{what: what, expected: want, got: got}
	}
	return nil
}

// gated reports whether the pod waits behind any lock's gate.
func gated(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
		return strings.HasPrefix(g.Name, locksv1.GatePrefix)
	})
}

// 2. Leader election.
func (d *demo) leaderElection(ctx context.Context) error {
	d.section("Leader election: the lock is granted to one pod of a Deployment")
	d.say("A DistributedLock named leader: the controller grants it to one pod labelled app=web",
		"at a time, oldest first, holds it in Redis for that pod, and labels the pod so a",
		"Service can route to the leader.")
	if _, err := d.k.apply(ctx, `
apiVersion: locks.lockwarden.dev/v1alpha1
kind: DistributedLock
metadata:
  name: leader
spec:
  leaseDuration: 10s
  candidates:
    matchLabels:
      app: web
`); err != nil {
		return err
	}
	d.say("A Deployment of three pods. The scheduler places them on the fake nodes, and kwok,",
		"playing the nodes' kubelets, runs them:")
	if _, err := d.k.apply(ctx, `
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: registry.example/web:1.0
`); err != nil {
		return err
	}
	var lock *locksv1.DistributedLock
	if err := d.waitFor(ctx, "the status of DistributedLock leader", "a holder and two waiting", func() (bool, string, error) {
		var err error
		if lock, err = d.lock(ctx, "leader"); err != nil {
			return false, "", err
		}
		return holderName(lock) != "" && len(lock.Status.Waiting) == 2,
			fmt.Sprintf("holder %s, waiting %v", orNone(holderName(lock)), lock.Status.Waiting), nil
	}); err != nil {
		return err
	}
	d.leader, d.leaderT, d.followers = holderName(lock), lock.Status.Holder.Token, lock.Status.Waiting
	if err := d.waitFor(ctx, "the holder marks on "+d.leader, "label "+locksv1.HolderLabelFor("leader")+"=true", func() (bool, string, error) {
		pod, err := d.pod(ctx, d.leader)
		if err != nil {
			return false, "", err
		}
		return pod.Labels[locksv1.HolderLabelFor("leader")] == "true", fmt.Sprintf("labels %v", pod.Labels), nil
	}); err != nil {
		return err
	}

	d.say("The grant, as users see it:")
	if _, err := d.k.run(ctx, "get", "dlock"); err != nil {
		return err
	}
	if _, err := d.k.run(ctx, "get", "pods", "-l", "app=web", "-o", "wide", "--show-labels"); err != nil {
		return err
	}
	if _, err := d.k.run(ctx, "get", "pod", d.leader, "-o", annotationsTemplate); err != nil {
		return err
	}
	for _, name := range append([]string{d.leader}, d.followers...) {
		pod, err := d.pod(ctx, name)
		if err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodRunning {
			return &checkError{what: "the phase of " + name, expected: "Running", got: string(pod.Status.Phase)}
		}
		lockName := ""
		if name == d.leader {
			lockName = "leader"
		}
		if err := checkMarks(pod, lockName, d.leaderT); err != nil {
			return err
		}
	}
	if !lock.Status.Holder.GrantedByController || lock.Status.Holder.OwnerID != lock.Status.Holder.PodUID+":0" {
		return &checkError{what: "the holder of leader", expected: "held by the controller as <pod UID>:0",
			got: fmt.Sprintf("owner %s, grantedByController=%t", lock.Status.Holder.OwnerID, lock.Status.Holder.GrantedByController)}
	}
	d.ok("%s holds leader (fencing token %d), labelled and annotated; %s wait, in that order",
		d.leader, d.leaderT, strings.Join(d.followers, " and "))
	return nil
}

// podColumns shows each pod's gates, the nightly lock's holder label, phase
// and node.
var podColumns = "custom-columns=NAME:.metadata.name,GATES:.spec.schedulingGates[*].name,HOLDS-NIGHTLY:.metadata.labels.holder\\.lockwarden\\.dev/nightly,PHASE:.status.phase,NODE:.spec.nodeName"

// 3. A guarded CronJob.
func (d *demo) guardedRun(ctx context.Context) error {
	d.section("A guarded CronJob: its runs queue behind the lock")
	d.say("A job that must never run twice at once. Its lock has the explicit key nightly,",
		"which the manager's --shared-key flag shares with every namespace: every DistributedLock",
		"naming it, in any namespace or cluster on this Redis, guards the same job. The CronJob's",
		"pod template carries one label, lockwarden.dev/lock: nightly; an admission policy creates",
		"its pods behind the scheduling gate gate.lockwarden.dev/nightly, and the scheduler",
		"leaves them alone until the controller grants one the lock and removes its gate. On these fake nodes a run lasts the 8s its pod annotation asks kwok for (long",
		"enough for the demo to look at it even on a busy machine).")
	if _, err := d.k.apply(ctx, `
apiVersion: locks.lockwarden.dev/v1alpha1
kind: DistributedLock
metadata:
  name: nightly
spec:
  key: nightly
  leaseDuration: 10s
---
apiVersion: batch/v1
kind: CronJob
metadata:
  name: nightly
spec:
  schedule: "0 2 * * *"
  jobTemplate:
    spec:
      backoffLimit: 0
      template:
        metadata:
          labels:
            job: nightly
            lockwarden.dev/lock: nightly
          annotations:
            `+plane.CompleteDelayAnnotation+`: 8s
        spec:
          restartPolicy: Never
          containers:
          - name: billing
            image: registry.example/billing:2.0
`); err != nil {
		return err
	}
	d.say("Two runs start at once, as two schedules, or two CronJobs on the same key, would start",
		"them (kubectl create job --from=cronjob makes the same Jobs without waiting for 2am):")
	for _, run := range []string{"run-1", "run-2"} {
		if _, err := d.k.run(ctx, "create", "job", run, "--from=cronjob/nightly"); err != nil {
			return err
		}
	}
	run1, err := d.waitForJobPod(ctx, "run-1", "ungated", func(p *corev1.Pod) bool { return !gated(p) })
	if err != nil {
		return err
	}
	run2, err := d.waitForJobPod(ctx, "run-2", "created", func(*corev1.Pod) bool { return true })
	if err != nil {
		return err
	}
	lock, err := d.waitForHolder(ctx, "nightly", run1.Name, run2.Name)
	if err != nil {
		return err
	}
	if _, err := d.k.run(ctx, "get", "pods", "-l", "job=nightly", "-o", podColumns); err != nil {
		return err
	}
	if _, err := d.k.run(ctx, "get", "dlock", "nightly"); err != nil {
		return err
	}
	if run2, err = d.pod(ctx, run2.Name); err != nil {
		return err
	}
	if !gated(run2) {
		return &checkError{what: "run-2's scheduling gate", expected: "still there while run-1 holds the lock", got: fmt.Sprint(run2.Spec.SchedulingGates)}
	}
	if lock.Status.Key != "nightly" {
		return &checkError{what: "the key of nightly", expected: "nightly", got: lock.Status.Key}
	}
	if err := checkMarks(run2, "", 0); err != nil {
		return err
	}
	d.ok("run-1's pod holds nightly and was ungated; run-2's stays gated while run-1 runs")

	d.say("run-1 completes; the controller grants nightly to run-2's pod and ungates it:")
	for _, run := range []string{"run-1", "run-2"} {
		if err := d.waitFor(ctx, "Job "+run, "Complete", func() (bool, string, error) {
			out, err := d.k.quiet(ctx, "get", "job", run, "-o", `jsonpath={.status.conditions[?(@.type=="Complete")].status}`)
			return strings.TrimSpace(out) == "True", "not complete yet", err
		}); err != nil {
			return err
		}
	}
	if _, err := d.k.run(ctx, "get", "jobs"); err != nil {
		return err
	}
	if _, err := d.k.run(ctx, "get", "pods", "-l", "job=nightly", "-o", podColumns); err != nil {
		return err
	}
	if run1, err = d.pod(ctx, run1.Name); err != nil {
		return err
	}
	if run2, err = d.pod(ctx, run2.Name); err != nil {
		return err
	}
	run1Stop, err := runStamp(run1, plane.StoppedAtAnnotation)
	if err != nil {
		return err
	}
	run2Start, err := runStamp(run2, plane.RunningAtAnnotation)
	if err != nil {
		return err
	}
	if !run2Start.After(run1Stop) {
		return &checkError{what: "the runs of nightly", expected: "run-2 starts after run-1 stops",
			got: fmt.Sprintf("run-1 stopped %s, run-2 started %s", run1Stop.Format(time.RFC3339Nano), run2Start.Format(time.RFC3339Nano))}
	}
	d.ok("the runs never overlapped: run-2's pod started %dms after run-1's stopped", run2Start.Sub(run1Stop).Milliseconds())
	return nil
}

// 4. Handover.
func (d *demo) handover(ctx context.Context) error {
	d.section("Handover: the leader's pod is deleted")
	d.say(fmt.Sprintf("%s is deleted (a rolling update, a drained node). Its container runs on through", d.leader),
		"its 2s grace period and then stops. The controller sees the pod events, releases the lock",
		"in Redis and grants it to the next candidate, without waiting for the 10s lease to run",
		"out. The ReplicaSet makes a new pod, which queues as a candidate. Two watches time it,",
		"one on the pod and one on the lock (the pod is gone once its container has stopped):")
	podArgs := []string{"get", "pods", "--field-selector=metadata.name=" + d.leader, "--watch", "--output-watch-events", "-o", `jsonpath={.type}{"\n"}`}
	lockArgs := []string{"get", "dlock", "leader", "--watch", "-o", `jsonpath={.status.holder.podName}{"\n"}`}
	fmt.Fprintf(d.out, "$ kubectl %s &\n$ kubectl %s &\n", shellJoin(podArgs), shellJoin(lockArgs))
	podWatch, err := d.k.watch(ctx, podArgs...)
	if err != nil {
		return err
	}
	defer podWatch.close()
	lockWatch, err := d.k.watch(ctx, lockArgs...)
	if err != nil {
		return err
	}
	defer lockWatch.close()
	// Both watches have listed the current state, so they see what follows.
	if _, _, err := podWatch.next(ctx, waitTimeout, func(s string) bool { return s == "ADDED" }); err != nil {
		return fmt.Errorf("the watch on %s: %w", d.leader, err)
	}
	if _, _, err := lockWatch.next(ctx, waitTimeout, func(s string) bool { return s == d.leader }); err != nil {
		return fmt.Errorf("the watch on leader: %w", err)
	}

	next := d.followers[0]
	sent := time.Now()
	if _, err := d.k.run(ctx, "delete", "pod", d.leader, "--wait=false"); err != nil {
		return err
	}
	returned := time.Now()
	deleted, _, err := podWatch.next(ctx, waitTimeout, func(s string) bool { return s == "DELETED" })
	if err != nil {
		return &checkError{what: "the pod watch", expected: "DELETED " + d.leader, got: err.Error()}
	}
	granted, seen, err := lockWatch.next(ctx, waitTimeout, func(s string) bool { return s == next })
	if err != nil {
		var texts []string
		for _, l := range seen {
			texts = append(texts, orNone(l.text))
		}
		return &checkError{what: "the lock watch", expected: "holder " + next, got: fmt.Sprintf("%v (holders seen: %v)", err, texts)}
	}
	ms := func(t time.Time) string { return fmt.Sprintf("%+6dms", t.Sub(sent).Milliseconds()) }
	type event struct {
		at   time.Time
		what string
	}
	events := []event{
		{sent, "kubectl delete started"},
		{returned, "kubectl delete returned"},
		{deleted.at, "pod watch: " + d.leader + " DELETED (stopped, and removed)"},
		{granted.at, "lock watch: holder " + next},
	}
	slices.SortStableFunc(events, func(a, b event) int { return a.at.Compare(b.at) })
	for _, ev := range events {
		fmt.Fprintf(d.out, "  %s  %s\n", ms(ev.at), ev.what)
	}
	handover := granted.at.Sub(deleted.at)

	// The ReplicaSet's new pod joins the waiting list behind the other.
	var lock *locksv1.DistributedLock
	expected := fmt.Sprintf("holder %s, %s waiting", next, d.followers[1])
	if err := d.waitFor(ctx, "the status of DistributedLock leader", expected, func() (bool, string, error) {
		var err error
		if lock, err = d.lock(ctx, "leader"); err != nil {
			return false, "", err
		}
		return holderName(lock) == next && slices.Contains(lock.Status.Waiting, d.followers[1]),
			fmt.Sprintf("holder %s, waiting %v", orNone(holderName(lock)), lock.Status.Waiting), nil
	}); err != nil {
		return err
	}
	if _, err := d.k.run(ctx, "get", "dlock", "leader"); err != nil {
		return err
	}
	if _, err := d.k.run(ctx, "get", "pods", "-l", "app=web", "-L", locksv1.HolderLabelFor("leader")); err != nil {
		return err
	}
	if handover >= maxHandover {
		return &checkError{what: "the handover time", expected: "under " + maxHandover.String() + " after the pod was gone", got: handover.String()}
	}
	if lock.Status.Holder.Token <= d.leaderT {
		return &checkError{what: "the fencing token", expected: fmt.Sprintf("above %s's %d", d.leader, d.leaderT), got: strconv.FormatInt(lock.Status.Holder.Token, 10)}
	}
	if err := d.waitFor(ctx, "the holder marks on "+next, "label "+locksv1.HolderLabelFor("leader")+"=true", func() (bool, string, error) {
		pod, err := d.pod(ctx, next)
		if err != nil {
			return false, "", err
		}
		return checkMarks(pod, "leader", lock.Status.Holder.Token) == nil, fmt.Sprintf("labels %v, annotations %v", pod.Labels, pod.Annotations), nil
	}); err != nil {
		return err
	}
	d.ok("%s took over leader (fencing token %d -> %d) %dms after the deletion request, %+dms from %s being gone",
		next, d.leaderT, lock.Status.Holder.Token, granted.at.Sub(sent).Milliseconds(), handover.Milliseconds(), d.leader)
	return nil
}

// 5. An in-pod client.
func (d *demo) inPodClient(ctx context.Context) error {
	d.section("An in-pod client holds a lock")
	d.say("Code in a pod can take locks itself with pkg/redislock. Built by redislock.FromEnv, the",
		"client's ID is the pod's UID (POD_UID, from the downward API), so its owners are",
		"\"<pod UID>:<n>\": the controller shows which pod holds the lock, and releases the hold",
		"when the pod ends.")
	d.say("The worker is a Job's pod; on these fake nodes it fails (exit code 1) 15s after it",
		"starts, as its annotations ask kwok:")
	if _, err := d.k.apply(ctx, `
apiVersion: batch/v1
kind: Job
metadata:
  name: worker
spec:
  backoffLimit: 0
  template:
    metadata:
      labels:
        app: worker
      annotations:
        `+plane.CompleteDelayAnnotation+`: 15s
        `+plane.FailAnnotation+`: "true"
    spec:
      restartPolicy: Never
      containers:
      - name: worker
        image: registry.example/worker:1.0
`); err != nil {
		return err
	}
	workerPod, err := d.waitForJobPod(ctx, "worker", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if err != nil {
		return err
	}
	uid := string(workerPod.UID)

	key := redislock.LockName(namespace, "jobs")
	d.say(fmt.Sprintf("The worker takes the lock %s, the default key of the DistributedLock demo/jobs,", key),
		"before that resource even exists. The demo runs the worker's code itself:",
		"",
		fmt.Sprintf("  client, _ := redislock.New(rdb, redislock.Options{ID: %q}) // as FromEnv does", uid),
		fmt.Sprintf("  hold, _ := client.NewMutex(redislock.LockName(%q, \"jobs\"), nil).Lock(ctx)", namespace))
	rdb := redis.NewClient(&redis.Options{Addr: d.e.redisAddr})
	defer rdb.Close()
	// A short watchdog lease, so the worker notices the release within a second.
	worker, err := redislock.New(rdb, redislock.Options{ID: uid, WatchdogLease: 3 * time.Second})
	if err != nil {
		return err
	}
	defer worker.Close()
	mutex, err := worker.NewMutex(key, nil)
	if err != nil {
		return err
	}
	lockCtx, cancel := context.WithTimeout(ctx, waitTimeout)
	hold, err := mutex.Lock(lockCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("the worker's Lock: %w", err)
	}
	inspector, err := redislock.New(rdb, redislock.Options{ID: "demo-inspector"})
	if err != nil {
		return err
	}
	defer inspector.Close()
	info, err := inspector.Inspect(ctx, key)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "  -> Redis: %s\n", describe(info))
	if !info.Held() || info.Holders[0].Owner != hold.Owner() {
		return &checkError{what: "the lock in Redis", expected: "held by " + string(hold.Owner()), got: describe(info)}
	}

	d.say("Now the DistributedLock for that key:")
	if _, err := d.k.apply(ctx, `
apiVersion: locks.lockwarden.dev/v1alpha1
kind: DistributedLock
metadata:
  name: jobs
spec:
  candidates:
    matchLabels:
      app: worker
`); err != nil {
		return err
	}
	lock, err := d.waitForHolder(ctx, "jobs", workerPod.Name)
	if err != nil {
		return err
	}
	if _, err := d.k.run(ctx, "get", "dlock", "jobs", "-o",
		"custom-columns=NAME:.metadata.name,HOLDER:.status.holder.podName,OWNER:.status.holder.ownerID,BY-CONTROLLER:.status.holder.grantedByController,TOKEN:.status.holder.token"); err != nil {
		return err
	}
	h := lock.Status.Holder
	if h.GrantedByController || h.OwnerID != string(hold.Owner()) || h.Token != hold.Token() || h.PodUID != uid {
		return &checkError{what: "the holder of jobs",
			expected: fmt.Sprintf("pod %s, owner %s, grantedByController=false, token %d", workerPod.Name, hold.Owner(), hold.Token()),
			got:      fmt.Sprintf("pod %s, owner %s, grantedByController=%t, token %d", h.PodName, h.OwnerID, h.GrantedByController, h.Token)}
	}
	d.ok("the controller shows the worker's own hold: owner %s, grantedByController=false", h.OwnerID)

	d.say("The worker's pod fails, 15s after it started:")
	if _, err := d.waitForHolder(ctx, "jobs", ""); err != nil {
		return err
	}
	if _, err := d.k.run(ctx, "get", "pods", "-l", "app=worker", "-o",
		"custom-columns=NAME:.metadata.name,PHASE:.status.phase,EXIT-CODE:.status.containerStatuses[0].state.terminated.exitCode"); err != nil {
		return err
	}
	if _, err := d.k.run(ctx, "get", "dlock", "jobs"); err != nil {
		return err
	}
	if info, err = inspector.Inspect(ctx, key); err != nil {
		return err
	}
	fmt.Fprintf(d.out, "  -> Redis: %s\n", describe(info))
	if info.Held() {
		return &checkError{what: "the lock in Redis after the worker failed", expected: "free", got: describe(info)}
	}
	select {
	case <-hold.Done():
		fmt.Fprintf(d.out, "  -> the worker's hold.Context() ended: %v\n", hold.Err())
	case <-time.After(waitTimeout):
		return &checkError{what: "the worker's hold", expected: "its context cancelled once the hold was released", got: "still live"}
	case <-ctx.Done():
		return ctx.Err()
	}
	if !errors.Is(hold.Err(), redislock.ErrNotOwner) {
		return &checkError{what: "why the worker's hold ended", expected: redislock.ErrNotOwner.Error(), got: fmt.Sprint(hold.Err())}
	}
	pod, err := d.pod(ctx, workerPod.Name)
	if err != nil {
		return err
	}
	if pod.Status.Phase != corev1.PodFailed {
		return &checkError{what: "the phase of " + pod.Name, expected: "Failed", got: string(pod.Status.Phase)}
	}
	if err := checkMarks(pod, "", 0); err != nil {
		return err
	}
	d.ok("the worker's hold was released in Redis when the pod failed, and the worker was told")
	return nil
}

// describe summarises a lock in Redis.
func describe(info redislock.LockInfo) string {
	if !info.Held() {
		return fmt.Sprintf("%s is free (the fencing counter is at %d)", info.Name, info.Token)
	}
	return fmt.Sprintf("%s is held by %s, fencing token %d, lease %.1fs left", info.Name, info.Holders[0].Owner, info.Token, info.TTL.Seconds())
}

// 6. Summary.
func (d *demo) summary(ctx context.Context) error {
	d.section("Where things stand")
	lock, err := d.lock(ctx, "leader")
	if err != nil {
		return err
	}
	if _, err := d.k.run(ctx, "get", "dlock", "-o", "wide"); err != nil {
		return err
	}
	// Events are sent asynchronously; wait for the last one of the story.
	expected := []string{"leader Acquired", "leader HolderTerminated", "nightly Acquired", "nightly HolderTerminated", "jobs HolderTerminated"}
	if err := d.waitFor(ctx, "the controller's Events", fmt.Sprint(expected), func() (bool, string, error) {
		out, err := d.k.quiet(ctx, "get", "events", "--field-selector=involvedObject.kind=DistributedLock",
			"-o", `jsonpath={range .items[*]}{.involvedObject.name} {.reason}{"\n"}{end}`)
		if err != nil {
			return false, "", err
		}
		have := strings.Split(strings.TrimSpace(out), "\n")
		for _, e := range expected {
			if !slices.Contains(have, e) {
				return false, fmt.Sprint(have), nil
			}
		}
		return true, "", nil
	}); err != nil {
		return err
	}
	if _, err := d.k.run(ctx, "get", "events", "--field-selector=involvedObject.kind=DistributedLock",
		"-o", "custom-columns=LOCK:.involvedObject.name,REASON:.reason,MESSAGE:.message"); err != nil {
		return err
	}
	if holderName(lock) != d.followers[0] {
		return &checkError{what: "the holder of leader", expected: d.followers[0], got: orNone(holderName(lock))}
	}
	return nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
