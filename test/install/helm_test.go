package install

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/plane"
	"github.com/lockwarden/lockwarden/internal/podrun"
)

// The release, namespace and image the documented commands name.
const (
	releaseNS   = "lockwarden-system"
	releaseName = "lockwarden"
	chartImage  = "registry.example/lockwarden/manager"
)

// Install with Helm, upgrade, and uninstall with crd.keep=false: the
// pre-delete hook deletes every lock while the manager runs, the manager
// releases them in Redis, and the CRD goes instead of staying Terminating.
func TestHelmInstallUpgradeUninstall(t *testing.T) {
	ctx := t.Context()
	cleanSlate(t)
	deploy := helmInstall(t, "--set", "crd.keep=false")
	m, appNS, pod, lock := grantedLock(t, deploy, "helm-app-")
	owner := lock.Status.Holder.OwnerID

	// An upgrade changes the Deployment and keeps the lock and its grant.
	helmCmd(t, "upgrade", releaseName, filepath.Join(root, "dist", "chart"), "-n", releaseNS, "--reuse-values",
		"--set", "manager.logLevel=debug", "--set", "manager.maxConcurrentReconciles=2", "--wait", "--timeout", "2m")
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(deploy), deploy); err != nil {
		t.Fatal(err)
	}
	args := strings.Join(managerContainer(t, deploy).Args, " ")
	if !strings.Contains(args, "--zap-log-level=debug") || !strings.Contains(args, "--max-concurrent-reconciles=2") {
		t.Errorf("helm upgrade did not reach the Deployment: %s", args)
	}
	waitGranted(t, lock, pod)
	if lock.Status.Holder.OwnerID != owner {
		t.Errorf("the upgrade changed the grant: %s, was %s", lock.Status.Holder.OwnerID, owner)
	}

	hook := helmUninstallServingHook(t)
	if code := hook.Wait(t, 10*time.Second); code != 0 {
		t.Fatalf("the uninstall hook exited %d", code)
	}
	if log := hook.Log.String(); !strings.Contains(log, "every DistributedLock is gone") || strings.Contains(log, "removed the finalizer") {
		t.Errorf("the hook did not leave the locks to the manager:\n%s", log)
	}
	m.Stop(t, 40*time.Second)
	checkUninstalled(t)
	if n := redisSrv.Client(t).Exists(ctx, appNS+"/leader").Val(); n != 0 {
		t.Errorf("the lock's key is still held in Redis: the manager did not release it")
	}
}

// Uninstalling with the manager already gone (killed, its Lease not
// released): the hook waits out the Lease, removes the finalizers itself,
// and the CRD goes.
func TestHelmUninstallWithTheManagerGone(t *testing.T) {
	cleanSlate(t)
	m, appNS, _, _ := grantedLock(t, helmInstall(t, "--set", "crd.keep=false"), "helm-gone-")
	m.Kill()

	hook := helmUninstallServingHook(t)
	if code := hook.Wait(t, 10*time.Second); code != 0 {
		t.Fatalf("the uninstall hook exited %d", code)
	}
	if log := hook.Log.String(); !strings.Contains(log, "removed the finalizer") || !strings.Contains(log, appNS) {
		t.Errorf("the hook did not say which lock it let go:\n%s", log)
	}
	checkUninstalled(t)
}

// A kustomize install taken over by Helm with installing.md's commands, then
// uninstalled as operating.md says, locks first while the manager runs.
func TestKustomizeInstallMovedToHelmAndUninstalled(t *testing.T) {
	ctx := t.Context()
	cleanSlate(t)
	deploy := kustomizeInstall(t)
	m, appNS, pod, lock := grantedLock(t, deploy, "moved-")

	runReadme(t, "adopt-into-helm")
	out := helmCmd(t, "list", "-n", releaseNS, "-q")
	if strings.TrimSpace(out) != releaseName {
		t.Fatalf("helm list: %q", out)
	}
	var cms corev1.ConfigMapList
	if err := k8s.List(ctx, &cms, client.InNamespace(releaseNS)); err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		if cm.Labels["helm.sh/chart"] == "" && cm.Name != "kube-root-ca.crt" {
			t.Errorf("kustomize's ConfigMap %s is left", cm.Name)
		}
	}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(deploy), deploy); err != nil || deploy.Labels["app.kubernetes.io/managed-by"] != "Helm" {
		t.Errorf("the Deployment is not Helm's: %v %v", deploy.Labels, err)
	}
	waitGranted(t, lock, pod)

	stopKwokPods(t)
	runReadme(t, "uninstall-locks")
	if n := redisSrv.Client(t).Exists(ctx, appNS+"/leader").Val(); n != 0 {
		t.Errorf("the lock's key is still held in Redis: the manager did not release it")
	}
	m.Stop(t, 40*time.Second)
	runReadme(t, "uninstall-helm")
	checkUninstalled(t)
}

// A kustomize install uninstalled as operating.md says, the manager gone
// first: its finalizer removal, then kustomize's delete.
func TestKustomizeUninstallWithTheManagerGone(t *testing.T) {
	ctx := t.Context()
	cleanSlate(t)
	m, _, _, lock := grantedLock(t, kustomizeInstall(t), "gone-")
	// One manager per cluster: a Helm release beside it is refused.
	toolsDir(t)
	if out, err := helmOutput(ctx, "install", releaseName, filepath.Join(root, "dist", "chart"), "-n", "second-system", "--create-namespace",
		"--set", "manager.image.repository="+chartImage); err == nil || !strings.Contains(out, "already installed in this cluster, without Helm") {
		t.Errorf("a Helm release beside the kustomize install: %v\n%s", err, out)
	}
	_ = k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "second-system"}})
	m.Kill()

	// Step 1 waits for ever with no manager: operating.md's kubectl wait
	// gives up; the finalizers are then removed as it says.
	if out, err := readmeCommand(t, "uninstall-locks", 15*time.Second); err == nil {
		t.Fatalf("deleting the locks with no manager succeeded; operating.md says it waits:\n%s", out)
	}
	runReadme(t, "uninstall-manager-gone")
	eventually(t, 30*time.Second, "the lock gone", func() (bool, error) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(lock), &locksv1.DistributedLock{})
		return apierrors.IsNotFound(err), err
	})
	stopKwokPods(t)
	runReadme(t, "uninstall-kustomize")
	checkUninstalled(t)
}

// grantedLock runs the image's manager as deploy's pod, and has it grant a
// lock to a candidate pod in a namespace of its own.
func grantedLock(t *testing.T, deploy *appsv1.Deployment, prefix string) (*podrun.Process, string, *corev1.Pod, *locksv1.DistributedLock) {
	t.Helper()
	m := startManager(t, deploy)
	appNS, pod := createCandidate(t, prefix)
	lock := createLeaderLock(t, appNS, "leader")
	waitGranted(t, lock, pod)
	return m, appNS, pod, lock
}

// kustomizeInstall deploys config/default with make deploy, as installing.md
// says, and creates the Redis Secret.
func kustomizeInstall(t *testing.T) *appsv1.Deployment {
	t.Helper()
	mustMake(t, "deploy", "IMG="+testImage)
	deploy := &appsv1.Deployment{}
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: releaseNS, Name: "lockwarden-controller-manager"}, deploy); err != nil {
		t.Fatal(err)
	}
	createRedisSecret(t, releaseNS)
	return deploy
}

// helmInstall creates the namespace and the Redis Secret and installs the
// chart as installing.md says, with the test's image, and returns the
// manager's Deployment once it is available.
func helmInstall(t *testing.T, values ...string) *appsv1.Deployment {
	t.Helper()
	ctx := t.Context()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNS}}); err != nil {
		t.Fatal(err)
	}
	createRedisSecret(t, releaseNS)
	out := helmCmd(t, append([]string{"install", releaseName, filepath.Join(root, "dist", "chart"), "-n", releaseNS,
		"--set", "manager.image.repository=" + chartImage, "--set", "manager.image.tag=" + testVersion,
		// kwok completes a Job's pod after this delay: the test runs the
		// hook's container itself, then lets kwok complete it.
		"--set-string", `uninstall.podAnnotations.pod-complete\.stage\.kwok\.x-k8s\.io/delay=10m`,
		"--wait", "--timeout", "2m"}, values...)...)
	if !strings.Contains(out, "create secret generic lockwarden-redis") {
		t.Errorf("helm install printed no NOTES:\n%s", out)
	}
	deploy := &appsv1.Deployment{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: "lockwarden-controller-manager"}, deploy); err != nil {
		t.Fatal(err)
	}
	if image := managerContainer(t, deploy).Image; image != chartImage+":"+testVersion {
		t.Errorf("the chart's manager image is %s", image)
	}
	if deploy.Status.AvailableReplicas != *deploy.Spec.Replicas {
		t.Errorf("helm install --wait returned with %d of %d replicas available", deploy.Status.AvailableReplicas, *deploy.Spec.Replicas)
	}
	waitEstablished(t)
	return deploy
}

// helmUninstallServingHook runs helm uninstall and, while helm waits for
// the pre-delete hook's Job, runs the Job's container from the image as
// the kubelet would, then lets kwok complete its pod. It returns the
// hook's process once helm has finished.
func helmUninstallServingHook(t *testing.T) *podrun.Process {
	t.Helper()
	ctx := t.Context()
	stopKwokPods(t)
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := helmOutput(context.Background(), "uninstall", releaseName, "-n", releaseNS, "--wait", "--timeout", "4m")
		done <- result{out, err}
	}()
	var hookPod corev1.Pod
	eventually(t, 60*time.Second, "the uninstall hook's pod", func() (bool, error) {
		var pods corev1.PodList
		err := k8s.List(ctx, &pods, client.InNamespace(releaseNS), client.MatchingLabels{"app.kubernetes.io/component": "uninstall"})
		if err != nil || len(pods.Items) == 0 {
			return false, err
		}
		hookPod = pods.Items[0]
		return true, nil
	})
	hook := startContainer(t, &hookPod, "uninstall")
	hook.Wait(t, 3*time.Minute)
	// Done: kwok completes the pod now, the Job succeeds, helm goes on.
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		plane.NextAtAnnotation: time.Now().UTC().Format(time.RFC3339Nano)}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := k8s.Patch(ctx, &hookPod, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("helm uninstall: %v\n%s\nhook:\n%s", r.err, r.out, hook.Log.String())
		}
	case <-time.After(4 * time.Minute):
		t.Fatal("helm uninstall did not return")
	}
	return hook
}

// checkUninstalled checks nothing of lockwarden is left: no release, no
// CRD (so no lock), no cluster-wide object, no namespace.
func checkUninstalled(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	eventually(t, 60*time.Second, "the CRD gone", func() (bool, error) {
		err := k8s.Get(ctx, client.ObjectKey{Name: crdName}, &apiextensionsv1.CustomResourceDefinition{})
		return apierrors.IsNotFound(err), err
	})
	if out := helmCmd(t, "list", "-A", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("helm releases left: %s", out)
	}
	for _, kind := range []string{"clusterroles", "clusterrolebindings", "validatingadmissionpolicies", "mutatingadmissionpolicies"} {
		out, err := exec.Command(filepath.Join(pl.AssetsDir, "kubectl"), "--kubeconfig", pl.Kubeconfig, "get", kind, "-o", "name").CombinedOutput()
		if err != nil && strings.Contains(string(out), "doesn't have a resource type") {
			continue // a Kubernetes before 1.34 has no MutatingAdmissionPolicy
		}
		if err != nil {
			t.Fatalf("kubectl get %s: %v\n%s", kind, err, out)
		}
		if left := regexp.MustCompile(`(?m)^.*lockwarden.*$`).FindAllString(string(out), -1); len(left) > 0 {
			t.Errorf("cluster-wide objects left: %v", left)
		}
	}
}

// cleanSlate makes sure no earlier install is left, and that the
// namespace is gone when the test ends, so the next can create it.
func cleanSlate(t *testing.T) {
	t.Helper()
	if err := k8s.Get(t.Context(), client.ObjectKey{Name: crdName}, &apiextensionsv1.CustomResourceDefinition{}); !apierrors.IsNotFound(err) {
		t.Fatalf("an earlier test left lockwarden installed (%v)", err)
	}
	t.Cleanup(func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNS}}
		_ = k8s.Delete(context.Background(), ns)
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) {
			if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(ns), ns); apierrors.IsNotFound(err) {
				return
			}
			stopKwokPods(t)
			time.Sleep(200 * time.Millisecond)
		}
		t.Errorf("namespace %s not gone", releaseNS)
	})
}

// stopKwokPods removes the manager's pods at once: kwok keeps a deleted pod
// for its whole grace period (the Deployment's 40s), as a kubelet whose
// container ignores SIGTERM would, which deletions would wait for. The
// manager that matters runs as the test's process.
func stopKwokPods(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var deploys appsv1.DeploymentList
	if err := k8s.List(ctx, &deploys, client.InNamespace(releaseNS)); err == nil {
		for i := range deploys.Items {
			_ = k8s.Patch(ctx, &deploys.Items[i], client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":0}}`)))
		}
	}
	// Until the ReplicaSets have stopped making new ones.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(releaseNS), client.MatchingLabels{"app.kubernetes.io/component": "manager"}); err != nil || len(pods.Items) == 0 {
			return
		}
		for i := range pods.Items {
			_ = k8s.Delete(ctx, &pods.Items[i], client.GracePeriodSeconds(0))
		}
	}
}

// runReadme runs the documentation's command block of that name, failing
// the test if it fails.
func runReadme(t *testing.T, name string) string {
	t.Helper()
	out, err := readmeCommand(t, name, 4*time.Minute)
	if err != nil {
		t.Fatalf("the documentation's block %s: %v\n%s", name, err, out)
	}
	return out
}

// readmeCommand runs the documentation's shell block marked
// "<!-- test/install: NAME -->" (docBlock), as written, with bash in the
// repository, with the plane's kubectl, bin/helm and lockwarden on the PATH.
func readmeCommand(t *testing.T, name string, timeout time.Duration) (string, error) {
	t.Helper()
	return runScript(t, docBlock(t, name), toolEnv(t), timeout)
}

// runScript runs a script with bash -euo pipefail in the repository, in the
// environment env, killing the whole of it at the timeout.
func runScript(t *testing.T, script string, env []string, timeout time.Duration) (string, error) {
	t.Helper()
	// On a cluster before 1.36, the documentation says to use another
	// overlay wherever it says config/default; DEPLOY_CONFIG names it, as
	// for make.
	if overlay := os.Getenv("DEPLOY_CONFIG"); overlay != "" {
		script = strings.ReplaceAll(script, "config/default", overlay)
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = root
	cmd.Env = env
	// At the timeout, the whole block: kubectl wait too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// docPages are the pages whose marked shell blocks the tests run.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join(root, "README.md")}, pages...)
}

// docBlockMarker is the comment above a shell block that a test runs: in a
// block quote too, where each line starts with "> ".
var docBlockMarker = regexp.MustCompile(`(?m)^((?:> ?)*)<!-- test/install: ([a-z0-9-]+) -->\n`)

// docBlocks returns every marked shell block of the README and docs/, by
// name, each with the quote prefix of its lines removed. A marker not
// followed by a sh block, or a name used twice, fails the test.
func docBlocks(t *testing.T) map[string]string {
	t.Helper()
	blocks := map[string]string{}
	for _, page := range docPages(t) {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		for _, m := range docBlockMarker.FindAllStringSubmatchIndex(text, -1) {
			prefix, name := text[m[2]:m[3]], text[m[4]:m[5]]
			lines := strings.Split(text[m[1]:], "\n")
			if len(lines) == 0 || lines[0] != prefix+"```sh" {
				t.Fatalf("%s: the marker %s is not followed by a sh block", page, name)
			}
			var body []string
			closed := false
			for _, line := range lines[1:] {
				if strings.TrimRight(line, " ") == strings.TrimRight(prefix+"```", " ") {
					closed = true
					break
				}
				if !strings.HasPrefix(line, prefix) {
					break
				}
				body = append(body, strings.TrimPrefix(line, prefix))
			}
			if !closed {
				t.Fatalf("%s: the block %s is not closed", page, name)
			}
			if _, dup := blocks[name]; dup {
				t.Fatalf("%s: a second block named %s", page, name)
			}
			blocks[name] = strings.Join(body, "\n") + "\n"
		}
	}
	return blocks
}

// docBlock returns the marked shell block of that name.
func docBlock(t *testing.T, name string) string {
	t.Helper()
	block, ok := docBlocks(t)[name]
	if !ok {
		t.Fatalf("neither the README nor docs/ has a command block %s", name)
	}
	return block
}

// toolEnv is the environment the documentation's commands run in: the plane's
// kubectl and kubeconfig, bin/helm with a configuration of its own, and
// the lockwarden command.
func toolEnv(t *testing.T) []string {
	t.Helper()
	bin := toolsDir(t)
	home := t.TempDir()
	return []string{"PATH=" + bin + ":/usr/local/bin:/usr/bin:/bin", "KUBECONFIG=" + pl.Kubeconfig, "HOME=" + home,
		"HELM_CACHE_HOME=" + home, "HELM_CONFIG_HOME=" + home, "HELM_DATA_HOME=" + home}
}

// tools is the directory toolsDir fills, in the test's scratch directory.
var tools string

// toolsDir is a directory holding kubectl, helm, lockwarden and the
// kubectl-lockwarden plugin.
func toolsDir(t *testing.T) string {
	t.Helper()
	if tools != "" {
		return tools
	}
	dir := filepath.Join(scratch, "tools")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"kubectl": filepath.Join(pl.AssetsDir, "kubectl"), "helm": filepath.Join(root, "bin", "helm")} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "lockwarden"), "./cmd/lockwarden")
	build.Dir = root
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building lockwarden: %v\n%s", err, out)
	}
	// kubectl runs it as the plugin `kubectl lockwarden` under this name.
	if err := os.Symlink("lockwarden", filepath.Join(dir, "kubectl-lockwarden")); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	tools = dir
	return dir
}

// helmCmd runs bin/helm against the plane, failing the test if it fails.
func helmCmd(t *testing.T, args ...string) string {
	t.Helper()
	toolsDir(t)
	out, err := helmOutput(t.Context(), args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func helmOutput(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(tools, "helm"), args...)
	home, err := os.MkdirTemp("", "helm-home-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(home)
	cmd.Env = []string{"KUBECONFIG=" + pl.Kubeconfig, "HOME=" + home, "HELM_CACHE_HOME=" + home, "HELM_CONFIG_HOME=" + home, "HELM_DATA_HOME=" + home}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if err != nil {
		err = fmt.Errorf("%w: %s", err, out.String())
	}
	return out.String(), err
}

// TestPlaneVersion says which Kubernetes the install tests ran on, and, when
// LOCKWARDEN_EXPECT_KUBERNETES names a minor version (make
// test-k8s-oldest), that it is that one.
func TestPlaneVersion(t *testing.T) {
	v, err := clientset.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the install tests ran on Kubernetes %s", v.GitVersion)
	if want := os.Getenv("LOCKWARDEN_EXPECT_KUBERNETES"); want != "" && !strings.HasPrefix(v.GitVersion, "v"+want+".") {
		t.Errorf("the plane runs Kubernetes %s, want %s", v.GitVersion, want)
	}
}
