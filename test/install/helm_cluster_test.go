package install

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/plane"
)

// One release per cluster, and helm test: installed with Redis credentials
// of an ACL user, the manager becomes ready and helm test passes; with a
// wrong password in the Secret helm test fails, its check saying Redis
// refuses the credentials; a second release, in another namespace, is
// refused, naming the first, even with crd.enable=false (which, before,
// installed a second manager).
func TestHelmTestAndOneReleasePerCluster(t *testing.T) {
	ctx := t.Context()
	cleanSlate(t)
	aclUser(t, "lw-helm-test", "right-password")
	deploy := helmInstall(t)
	setRedisCredentials(t, "lw-helm-test", "right-password")
	m := startManager(t, deploy) // ready: Redis accepted the credentials

	code, log, out, err := helmTestServingPod(t)
	if code != 0 || err != nil || !strings.Contains(log, "Redis accepts the manager's credentials") || !strings.Contains(log, "can read DistributedLocks cluster-wide") {
		t.Fatalf("helm test with the right credentials: check exited %d, helm: %v\n%s\ncheck:\n%s", code, err, out, log)
	}

	setRedisCredentials(t, "lw-helm-test", "wrong-password")
	code, log, out, err = helmTestServingPod(t)
	if code != 1 || err == nil || !strings.Contains(out, "lockwarden-test") || !strings.Contains(log, "refuses the manager's credentials") ||
		!strings.Contains(log, "WRONGPASS") || strings.Contains(log, "wrong-password") {
		t.Fatalf("helm test with a wrong password: check exited %d (want 1, saying Redis refuses the credentials, the password not shown), helm: %v\n%s\ncheck:\n%s", code, err, out, log)
	}

	// A second release, elsewhere: refused before anything is applied.
	for _, values := range [][]string{nil, {"--set", "crd.enable=false"}} {
		out, err := helmOutput(ctx, append([]string{"install", "second", filepath.Join(root, "dist", "chart"), "-n", "second-system", "--create-namespace",
			"--set", "manager.image.repository=" + chartImage, "--set", "manager.image.tag=" + testVersion}, values...)...)
		if err == nil || !strings.Contains(out, "lockwarden is already installed in this cluster, by release lockwarden in namespace lockwarden-system") ||
			!strings.Contains(out, "one manager per cluster") {
			t.Errorf("a second release %v: %v\n%s", values, err, out)
		}
	}
	if out := helmCmd(t, "list", "-A", "-q"); strings.TrimSpace(out) != releaseName {
		t.Errorf("releases: %q", out)
	}
	_ = k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "second-system"}})

	// Its own upgrade is not a second release.
	helmCmd(t, "upgrade", releaseName, filepath.Join(root, "dist", "chart"), "-n", releaseNS, "--reuse-values", "--set", "manager.logLevel=debug")

	m.Stop(t, 40*time.Second)
	uninstallKeptCRD(t)
}

// Namespaced mode on the plane: the manager, run as its ServiceAccount with
// only the chart's Roles, grants a lock in the namespace it watches and
// leaves alone one in a namespace it does not (no finalizer, no status,
// nothing in Redis); the gating policy gates pods only in the watched
// namespace; helm test passes with Roles only.
func TestHelmNamespaced(t *testing.T) {
	ctx := t.Context()
	cleanSlate(t)
	watched, pod := createCandidate(t, "watched-")
	other, otherPod := createCandidate(t, "unwatched-")
	deploy := helmInstall(t, "--set", "rbac.namespaced=true", "--set", "rbac.watchNamespaces={"+watched+"}")
	if args := strings.Join(managerContainer(t, deploy).Args, " "); !strings.Contains(args, "--watch-namespaces="+watched) {
		t.Fatalf("the manager's args: %s", args)
	}
	m := startManager(t, deploy)

	lock := createLeaderLock(t, watched, "leader")
	ignored := createLeaderLock(t, other, "leader")
	waitGranted(t, lock, pod)
	time.Sleep(3 * time.Second) // what it would have done there, it has done here
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(ignored), ignored); err != nil {
		t.Fatal(err)
	}
	if len(ignored.Finalizers) > 0 || ignored.Status.Holder != nil || len(ignored.Status.Conditions) > 0 {
		t.Errorf("the lock in unwatched namespace %s was touched: finalizers %v, status %+v", other, ignored.Finalizers, ignored.Status)
	}
	if n := redisSrv.Client(t).Exists(ctx, other+"/leader").Val(); n != 0 {
		t.Errorf("the unwatched lock's key is held in Redis")
	}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(otherPod), otherPod); err != nil || len(otherPod.Labels) != 1 {
		t.Errorf("the unwatched pod was marked: %v %v", otherPod.Labels, err)
	}
	if strings.Contains(m.Log.String(), other) {
		t.Errorf("the manager logged about the unwatched namespace %s:\n%s", other, m.Log.String())
	}

	// The gating policy, where the cluster has one, gates only there.
	_, err := k8s.RESTMapper().RESTMapping(schema.GroupKind{Group: "admissionregistration.k8s.io", Kind: "MutatingAdmissionPolicy"}, "v1")
	if err != nil && !meta.IsNoMatchError(err) {
		t.Fatal(err)
	}
	if err != nil {
		t.Log("the plane serves no MutatingAdmissionPolicy v1: the chart installed no gating policy to check")
	} else {
		for ns, gated := range map[string]bool{watched: true, other: false} {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guarded", Labels: map[string]string{"lockwarden.dev/lock": "leader"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
			}
			if err := k8s.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
			if got := slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == "gate.lockwarden.dev/leader" }); got != gated {
				t.Errorf("a pod labelled lockwarden.dev/lock in %s: gated %v, want %v (%v)", ns, got, gated, p.Spec.SchedulingGates)
			}
			_ = k8s.Delete(ctx, p, client.GracePeriodSeconds(0))
		}
	}

	if code, log, out, err := helmTestServingPod(t); code != 0 || err != nil || !strings.Contains(log, "can read DistributedLocks in namespace "+watched) {
		t.Errorf("helm test in namespaced mode: check exited %d, helm: %v\n%s\ncheck:\n%s", code, err, out, log)
	}

	// The watched lock goes while the manager runs; the other has no
	// finalizer to wait for.
	for _, l := range []*locksv1.DistributedLock{lock, ignored} {
		if err := k8s.Delete(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the locks gone", func() (bool, error) {
		var list locksv1.DistributedLockList
		err := k8s.List(ctx, &list)
		return err == nil && len(list.Items) == 0, err
	})
	m.Stop(t, 40*time.Second)
	uninstallKeptCRD(t)
}

// aclUser adds an ACL user to the plane's Redis for the test.
func aclUser(t *testing.T, user, password string) {
	t.Helper()
	rdb := redisSrv.Client(t)
	if err := rdb.Do(t.Context(), "ACL", "SETUSER", user, "on", ">"+password, "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = redisSrv.Client(t).Do(context.Background(), "ACL", "DELUSER", user).Err() })
}

// setRedisCredentials writes the username and password into the release's
// Redis Secret, as a user rotating them would.
func setRedisCredentials(t *testing.T, user, password string) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"stringData": map[string]string{"username": user, "password": password}})
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: releaseNS, Name: "lockwarden-redis"}}
	if err := k8s.Patch(t.Context(), secret, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
}

// helmTestServingPod runs helm test and, while helm waits for the test
// pod, runs its container from the image as the kubelet would, then has
// kwok end the pod with the container's exit code. It returns that code,
// the container's output, and helm's output and error.
func helmTestServingPod(t *testing.T) (int, string, string, error) {
	t.Helper()
	ctx := t.Context()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := helmOutput(context.Background(), "test", releaseName, "-n", releaseNS, "--timeout", "2m")
		done <- result{out, err}
	}()
	var testPod corev1.Pod
	eventually(t, 60*time.Second, "helm test's pod, running", func() (bool, error) {
		var pods corev1.PodList
		err := k8s.List(ctx, &pods, client.InNamespace(releaseNS), client.MatchingLabels{"app.kubernetes.io/component": "test"})
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				testPod = p
				return true, nil
			}
		}
		return false, err
	})
	check := startContainer(t, &testPod, "check")
	code := check.Wait(t, 60*time.Second)
	// kwok ends the pod now, as the container did.
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		plane.ExitCodesAnnotation: strconv.Itoa(code),
		plane.NextAtAnnotation:    time.Now().UTC().Format(time.RFC3339Nano)}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := k8s.Patch(ctx, &testPod, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		return code, check.Log.String(), r.out, r.err
	case <-time.After(2 * time.Minute):
		t.Fatal("helm test did not return")
		return 0, "", "", nil
	}
}

// uninstallKeptCRD uninstalls the release, whose CRD the chart keeps
// (crd.keep, the default), then deletes the CRD, no lock being left.
func uninstallKeptCRD(t *testing.T) {
	t.Helper()
	stopKwokPods(t)
	helmCmd(t, "uninstall", releaseName, "-n", releaseNS, "--wait", "--timeout", "2m")
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: crdName}}
	if err := k8s.Delete(t.Context(), crd); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	checkUninstalled(t)
}
