package install

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/plane"
	"github.com/lockwarden/lockwarden/internal/podrun"
)

// publishedChart is the chart reference the documentation installs from. The
// tests install dist/chart in its place: that is the only change they make to
// a block's text. (A test of the published chart itself pushes it to a
// registry of its own; see test/release.)
const publishedChart = "oci://ghcr.io/lockwarden/charts/lockwarden"

// TestQuickStart runs the README's quick start as written on the plane: the
// chart installed against the plane's Redis, a lock and a CronJob whose pods
// name it, two runs of it, kubectl get dlock and kubectl lockwarden why. The
// second run must wait behind its gate until the first has stopped. The
// box's variant for clusters before 1.36, the gate written by hand, runs in a
// namespace of its own; on a plane that serves no MutatingAdmissionPolicy it
// is the only one that runs.
func TestQuickStart(t *testing.T) {
	cleanSlate(t)
	m := docInstall(t, "quickstart")
	variants := []string{"quickstart-cronjob-gate"}
	if servesMutatingAdmissionPolicy(t) {
		variants = append(variants, "quickstart-cronjob")
	}
	for _, cronjob := range variants {
		t.Run(cronjob, func(t *testing.T) {
			ns, env := docNamespace(t, "quickstart-")
			runDocBlock(t, cronjob, env)
			// kwok runs no container: this tells it how long the run's
			// container, "sleep 60", would run.
			runFor(t, ns, "nightly-report", time.Hour)
			runDocBlock(t, "quickstart-runs", env)
			first, second := jobPod(t, ns, "first"), jobPod(t, ns, "second")
			waitHolder(t, ns, "nightly-report", first.Name)
			waitGated(t, ns, second.Name, "gate.lockwarden.dev/nightly-report")

			out := runDocBlock(t, "quickstart-look", env)
			if !regexp.MustCompile(`(?m)^nightly-report\s.*\b` + regexp.QuoteMeta(first.Name) + `\b`).MatchString(out) {
				t.Errorf("kubectl get dlock does not show %s holding the lock:\n%s", first.Name, out)
			}
			if !strings.Contains(out, "pod "+second.Name+" waits behind 1 scheduling gate") || !strings.Contains(out, "held by pod "+first.Name) {
				t.Errorf("kubectl lockwarden why does not say %s waits for %s:\n%s", second.Name, first.Name, out)
			}

			// The first run ends; only then does the second start.
			endRun(t, first)
			waitHolder(t, ns, "nightly-report", second.Name)
			checkOneAfterTheOther(t, ns, first.Name, second.Name)
		})
	}
	docUninstall(t, m)
}

// TestRecipes runs the shell blocks of docs/recipes.md as written, each
// recipe in a namespace of its own, and checks what the page says follows.
// The recipes whose pods opt in with the label need the gating policy, as
// the page says: on a plane that serves no MutatingAdmissionPolicy (make
// test-k8s-oldest's 1.30) only the others run; make test runs them all.
func TestRecipes(t *testing.T) {
	cleanSlate(t)
	m := docInstall(t, "recipes")
	defer func() { docUninstall(t, m) }()
	gating := servesMutatingAdmissionPolicy(t)
	recipe := func(name string, byLabel bool, f func(t *testing.T)) {
		if byLabel && !gating {
			t.Logf("recipe %s: its pods opt in by label, which this plane's Kubernetes cannot gate; make test runs it on 1.36", name)
			return
		}
		t.Run(name, f)
	}

	recipe("cronjob", true, func(t *testing.T) {
		ns, env := docNamespace(t, "recipe-cronjob-")
		runDocBlock(t, "recipe-cronjob", env)
		runFor(t, ns, "billing", time.Hour) // the container's "sleep 60", for kwok
		runDocBlock(t, "recipe-cronjob-runs", env)
		first, second := jobPod(t, ns, "billing-1"), jobPod(t, ns, "billing-2")
		waitHolder(t, ns, "billing", first.Name)
		waitGated(t, ns, second.Name, "gate.lockwarden.dev/billing")
		endRun(t, first)
		waitHolder(t, ns, "billing", second.Name)
		checkOneAfterTheOther(t, ns, first.Name, second.Name)
	})

	recipe("leader", false, func(t *testing.T) {
		ns, env := docNamespace(t, "recipe-leader-")
		out := runDocBlock(t, "recipe-leader", env)
		lock := getLock(t, ns, "reports-leader")
		holder := lock.Status.Holder.PodName
		if !strings.Contains(out, holder) {
			t.Errorf("the pods labelled holder are not the lock's holder %s:\n%s", holder, out)
		}
		var pods corev1.PodList
		if err := k8s.List(t.Context(), &pods, client.InNamespace(ns), client.MatchingLabels{"holder.lockwarden.dev/reports-leader": "true"}); err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) != 1 || pods.Items[0].Name != holder {
			t.Errorf("pods labelled holder: %v, want only %s", podNames(pods.Items), holder)
		}
	})

	recipe("several-locks", true, func(t *testing.T) {
		ns, env := docNamespace(t, "recipe-several-")
		runDocBlock(t, "recipe-several-locks", env)
		pod := jobPod(t, ns, "migrate")
		// kwok ends the Job's run after a second, and the locks are released
		// then: each lock's Acquired Event names the grant it made.
		for _, name := range []string{"schema", "warehouse"} {
			eventually(t, 30*time.Second, "lock "+name+" granted to "+pod.Name, func() (bool, error) {
				var events corev1.EventList
				err := k8s.List(t.Context(), &events, client.InNamespace(ns))
				return slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
					return e.InvolvedObject.Kind == "DistributedLock" && e.InvolvedObject.Name == name && e.Reason == "Acquired" &&
						strings.Contains(e.Message, " to pod "+pod.Name+" ")
				}), err
			})
		}
		eventually(t, 30*time.Second, "the migrate pod run", func() (bool, error) {
			err := k8s.Get(t.Context(), client.ObjectKeyFromObject(pod), pod)
			return err == nil && len(pod.Spec.SchedulingGates) == 0 && pod.Annotations[plane.RunningAtAnnotation] != "", err
		})
	})

	recipe("fencing", true, func(t *testing.T) {
		ns, env := docNamespace(t, "recipe-fencing-")
		runDocBlock(t, "recipe-fencing-pod", env)
		holder := getLock(t, ns, "ledger").Status.Holder
		if holder == nil {
			t.Fatal("the ledger lock has no holder")
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holder.PodName}}
		// The file the kubelet would write into the downward API volume
		// holds the grant's token.
		eventually(t, 30*time.Second, "the token file to hold the grant's token", func() (bool, error) {
			err := k8s.Get(t.Context(), client.ObjectKeyFromObject(pod), pod)
			return err == nil && downwardFile(t, pod, "lockwarden", "token") == fmt.Sprint(holder.Token), err
		})

		env = append(env, "STORE_URL=redis://"+redisSrv.Addr+"/1")
		out := runDocBlock(t, "recipe-fencing-store", env)
		lines := slices.DeleteFunc(strings.Split(out, "\n"), func(l string) bool { return strings.TrimSpace(l) == "" })
		if len(lines) != 3 || lines[0] != "OK" || !strings.Contains(lines[1], "STALE fencing token") || lines[2] != "closed by the holder" {
			t.Errorf("the fenced writes: want OK, a refusal, and the holder's data; got:\n%s", out)
		}
	})

	// The shared key's recipe upgrades the release, which rolls the
	// manager's Deployment: the test's process that plays its pod is
	// restarted as the kubelet would, so it runs here, in the test that
	// started it, after the other recipes.
	if !gating {
		t.Log("recipe shared-key: its pods opt in by label, which this plane's Kubernetes cannot gate; make test runs it on 1.36")
		return
	}
	_, env := docNamespace(t, "recipe-shared-")
	for _, ns := range []string{"team-a", "team-b"} {
		t.Cleanup(func() { deleteNamespace(t, ns) })
	}
	runDocBlock(t, "recipe-shared-key-helm", env)
	m.Stop(t, 40*time.Second)
	deploy := managerDeployment(t)
	if args := strings.Join(managerContainer(t, deploy).Args, " "); !strings.Contains(args, "--shared-key=warehouse-load=team-a,team-b") {
		t.Fatalf("helm upgrade did not share the key: %s", args)
	}
	m = startManager(t, deploy)
	runDocBlock(t, "recipe-shared-key", env)

	// A run in each namespace: one runs, the other waits for it.
	var pods []*corev1.Pod
	for _, ns := range []string{"team-a", "team-b"} {
		runFor(t, ns, "load", time.Hour)
		kubectl(t, "-n", ns, "create", "job", "--from=cronjob/load", "load-1")
		pods = append(pods, jobPod(t, ns, "load-1"))
	}
	eventually(t, 30*time.Second, "one of the two runs granted the shared key", func() (bool, error) {
		a, b := getLock(t, "team-a", "load").Status.Holder, getLock(t, "team-b", "load").Status.Holder
		return (a == nil) != (b == nil), nil
	})
	waiting := pods[1]
	if getLock(t, "team-a", "load").Status.Holder == nil {
		waiting = pods[0]
	}
	waitGated(t, waiting.Namespace, waiting.Name, "gate.lockwarden.dev/load")
	// Their runs end with their namespaces, before the uninstall.
	for _, ns := range []string{"team-a", "team-b"} {
		deleteNamespace(t, ns)
	}
}

// docInstall runs the quick start's install block with the plane's Redis as
// "your Redis", and the chart from dist/chart, then runs the manager as the
// chart's pod. prefix names what the test is, in its failures.
func docInstall(t *testing.T, prefix string) *podrun.Process {
	t.Helper()
	env := append(toolEnv(t), "REDIS_URL=redis://"+redisSrv.Addr+"/0", "REDIS_PASSWORD=")
	runDocBlock(t, "quickstart-install", env)
	deploy := managerDeployment(t)
	waitEstablished(t)
	t.Logf("%s: the chart installed as the quick start says", prefix)
	return startManager(t, deploy)
}

// docUninstall uninstalls as operating.md says: the locks first, while the
// manager runs, then the release and the CRD.
func docUninstall(t *testing.T, m *podrun.Process) {
	t.Helper()
	stopKwokPods(t)
	runReadme(t, "uninstall-locks")
	m.Stop(t, 40*time.Second)
	runReadme(t, "uninstall-helm")
	checkUninstalled(t)
}

// runDocBlock runs the documentation's block of that name in env, the
// published chart replaced with dist/chart, and fails the test if it fails.
func runDocBlock(t *testing.T, name string, env []string) string {
	t.Helper()
	block := docBlock(t, name)
	if strings.Contains(block, "helm ") {
		if !strings.Contains(block, publishedChart) {
			t.Fatalf("the block %s runs helm, but not on the published chart %s", name, publishedChart)
		}
		block = strings.ReplaceAll(block, publishedChart, filepath.Join(root, "dist", "chart"))
	}
	out, err := runScript(t, block, env, 4*time.Minute)
	if err != nil {
		t.Fatalf("the documentation's block %s: %v\n%s", name, err, out)
	}
	t.Logf("%s:\n%s", name, out)
	return out
}

// docNamespace creates a namespace and returns it with the environment of
// toolEnv whose kubeconfig makes it the current namespace, as a reader's
// would be.
func docNamespace(t *testing.T, prefix string) (string, []string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNamespace(t, ns.Name) })
	if err := plane.WaitForServiceAccount(t.Context(), clientset, ns.Name); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	data, err := os.ReadFile(pl.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kubeconfig, data, 0o600); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "--kubeconfig", kubeconfig, "config", "set-context", "--current", "--namespace", ns.Name)
	env := slices.DeleteFunc(toolEnv(t), func(e string) bool { return strings.HasPrefix(e, "KUBECONFIG=") })
	return ns.Name, append(env, "KUBECONFIG="+kubeconfig)
}

// deleteNamespace deletes a namespace and stops its pods at once, so that
// its locks, whose grants last until their pods stop, can go. It runs in
// cleanups, after the test's context has ended.
func deleteNamespace(t *testing.T, ns string) {
	ctx := context.Background()
	if err := k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		t.Errorf("deleting namespace %s: %v", ns, err)
	}
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		t.Errorf("listing the pods of %s: %v", ns, err)
	}
	for i := range pods.Items {
		if err := k8s.Delete(ctx, &pods.Items[i], client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting pod %s/%s: %v", ns, pods.Items[i].Name, err)
		}
	}
}

// servesMutatingAdmissionPolicy says whether the plane serves the gating
// policy's kind, in any version, as the chart decides whether to install it.
func servesMutatingAdmissionPolicy(t *testing.T) bool {
	t.Helper()
	for _, gv := range []string{"admissionregistration.k8s.io/v1", "admissionregistration.k8s.io/v1beta1"} {
		list, err := clientset.Discovery().ServerResourcesForGroupVersion(gv)
		if err != nil {
			continue
		}
		for _, r := range list.APIResources {
			if r.Kind == "MutatingAdmissionPolicy" {
				return true
			}
		}
	}
	return false
}

// runFor has the CronJob's runs last d on kwok, which runs no container: the
// documentation's containers sleep, and a test must see a run wait for
// another before it ends (endRun ends one).
func runFor(t *testing.T, ns, cronjob string, d time.Duration) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"jobTemplate": map[string]any{"spec": map[string]any{"template": map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{plane.CompleteDelayAnnotation: d.String()}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	cj := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cronjob}}
	if err := k8s.Patch(t.Context(), cj, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
}

// endRun has kwok end the pod's run now, as its container's command would.
func endRun(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		plane.NextAtAnnotation: time.Now().UTC().Format(time.RFC3339Nano)}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := k8s.Patch(t.Context(), pod, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
}

// jobPod waits for the Job's pod and returns it.
func jobPod(t *testing.T, ns, job string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, 30*time.Second, "the pod of Job "+job, func() (bool, error) {
		var pods corev1.PodList
		err := k8s.List(t.Context(), &pods, client.InNamespace(ns), client.MatchingLabels{"batch.kubernetes.io/job-name": job})
		if err != nil || len(pods.Items) != 1 {
			return false, err
		}
		pod = &pods.Items[0]
		return true, nil
	})
	return pod
}

func getLock(t *testing.T, ns, name string) *locksv1.DistributedLock {
	t.Helper()
	lock := &locksv1.DistributedLock{}
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, lock); err != nil {
		t.Fatal(err)
	}
	return lock
}

// waitHolder waits until the lock's status names the pod as its holder.
func waitHolder(t *testing.T, ns, lock, pod string) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("lock %s held by %s", lock, pod), func() (bool, error) {
		h := getLock(t, ns, lock).Status.Holder
		return h != nil && h.PodName == pod, fmt.Errorf("holder %+v", h)
	})
}

// waitGated waits until the pod is behind the gate and still gated a second
// later: the lock keeps it waiting.
func waitGated(t *testing.T, ns, name, gate string) {
	t.Helper()
	gated := func() (bool, error) {
		pod := &corev1.Pod{}
		if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, pod); err != nil {
			return false, err
		}
		return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == gate }), nil
	}
	eventually(t, 30*time.Second, name+" behind "+gate, gated)
	time.Sleep(time.Second)
	if ok, err := gated(); !ok {
		t.Fatalf("%s lost its gate %s while the lock was held (%v)", name, gate, err)
	}
}

// checkOneAfterTheOther waits for the second pod to run and checks, from
// kwok's run stamps, that it started only after the first had stopped.
func checkOneAfterTheOther(t *testing.T, ns, first, second string) {
	t.Helper()
	stamp := func(pod, annotation string) time.Time {
		var at time.Time
		eventually(t, 30*time.Second, pod+"'s "+annotation, func() (bool, error) {
			p := &corev1.Pod{}
			if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: pod}, p); err != nil {
				return false, err
			}
			v, ok := p.Annotations[annotation]
			if !ok {
				return false, nil
			}
			var err error
			at, err = time.Parse(time.RFC3339Nano, v)
			return err == nil, err
		})
		return at
	}
	stopped, started := stamp(first, plane.StoppedAtAnnotation), stamp(second, plane.RunningAtAnnotation)
	if !started.After(stopped) {
		t.Errorf("%s started at %s, before %s stopped at %s", second, started, first, stopped)
	}
}

// downwardFile returns the content the kubelet would write to the file of
// the pod's downward API volume, for the fields the documentation uses: the
// pod's annotations.
func downwardFile(t *testing.T, pod *corev1.Pod, volume, path string) string {
	t.Helper()
	for _, v := range pod.Spec.Volumes {
		if v.Name != volume || v.DownwardAPI == nil {
			continue
		}
		for _, item := range v.DownwardAPI.Items {
			if item.Path != path {
				continue
			}
			m := regexp.MustCompile(`^metadata\.annotations\['([^']+)'\]$`).FindStringSubmatch(item.FieldRef.FieldPath)
			if m == nil {
				t.Fatalf("this test resolves annotations only, not %s", item.FieldRef.FieldPath)
			}
			return pod.Annotations[m[1]]
		}
	}
	t.Fatalf("the pod has no downward API file %s in a volume %s", path, volume)
	return ""
}

func managerDeployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	deploy := &appsv1.Deployment{}
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: releaseNS, Name: "lockwarden-controller-manager"}, deploy); err != nil {
		t.Fatal(err)
	}
	return deploy
}

func podNames(pods []corev1.Pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	return names
}
