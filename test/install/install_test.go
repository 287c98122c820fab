package install

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/manifests"
	"github.com/lockwarden/lockwarden/internal/plane"
	"github.com/lockwarden/lockwarden/internal/podrun"
)

const crdName = "distributedlocks.locks.lockwarden.dev"

// TestMakeInstallAndDeploy runs make install, uninstall, deploy and
// undeploy against the plane, as a user would against a cluster.
func TestMakeInstallAndDeploy(t *testing.T) {
	ctx := t.Context()
	mustMake(t, "install")
	waitEstablished(t)
	mustMake(t, "uninstall") // kubectl delete waits until the CRD is gone
	if err := k8s.Get(ctx, client.ObjectKey{Name: crdName}, &apiextensionsv1.CustomResourceDefinition{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after make uninstall the CRD is still there (%v)", err)
	}

	const deployed = "registry.example/lockwarden/manager:deploy-test"
	mustMake(t, "deploy", "IMG="+deployed)
	objects := decodeYAML(t, buildInstaller(t, deployed))
	for _, obj := range objects {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopy()); err != nil {
			t.Errorf("after make deploy: %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	deploy := typed[appsv1.Deployment](t, objects, "Deployment")
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(&deploy), &deploy); err != nil {
		t.Fatal(err)
	}
	if image := managerContainer(t, &deploy).Image; image != deployed {
		t.Errorf("make deploy IMG=%s deployed the image %s", deployed, image)
	}

	// kwok keeps a deleted pod for its whole grace period (the Deployment's
	// 40s), as a kubelet whose container ignores SIGTERM would; the
	// manager's pods are stopped at once so that undeploy's wait is for the
	// objects alone.
	if err := k8s.Patch(ctx, &deploy, client.RawPatch(client.Merge.Type(), []byte(`{"spec":{"replicas":0}}`))); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "-n", deploy.Namespace, "delete", "pods", "--all", "--grace-period=0", "--force")
	mustMake(t, "undeploy")
	for _, obj := range objects {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopy()); !apierrors.IsNotFound(err) {
			t.Errorf("after make undeploy: %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}

	// The trial overlay, which installing.md deploys with DEPLOY_CONFIG, gets
	// the image too. Its Redis cannot run on kwok's fake nodes, so it is
	// only built here.
	var managers []string
	for _, obj := range decodeYAML(t, buildInstaller(t, deployed, "DEPLOY_CONFIG=config/trial-redis")) {
		if obj.GetKind() == "Deployment" && obj.GetName() == deploy.Name {
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &d); err != nil {
				t.Fatal(err)
			}
			managers = append(managers, managerContainer(t, &d).Image)
		}
	}
	if !slices.Equal(managers, []string{deployed}) {
		t.Errorf("config/trial-redis's manager images: %v, want [%s]", managers, deployed)
	}
}

// TestInstallerRunsImage writes the installer with make build-installer,
// applies it to the plane with server-side apply, checks that every object
// was accepted and does its job, and then runs make image's image as the
// installed Deployment's pod would run: its command and args, its
// environment from the Redis Secret and the ConfigMap, its Secret volume,
// and the API server reached through its ServiceAccount's token. The manager
// must become ready and the leader, and grant a DistributedLock to a pod.
func TestInstallerRunsImage(t *testing.T) {
	ctx := t.Context()
	installer := filepath.Join(t.TempDir(), "install.yaml")
	data := buildInstaller(t, testImage)
	if err := os.WriteFile(installer, data, 0o600); err != nil {
		t.Fatal(err)
	}
	objects := decodeYAML(t, data)
	kinds := map[string]bool{}
	for _, obj := range objects {
		kinds[obj.GetKind()] = true
	}
	for _, kind := range []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap", "Deployment", "PodDisruptionBudget"} {
		if !kinds[kind] {
			t.Errorf("the installer has no %s", kind)
		}
	}

	kubectl(t, "apply", "--server-side", "--field-manager=install-test", "-f", installer)
	for _, obj := range objects {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopy()); err != nil {
			t.Errorf("%s %s was not created: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	waitEstablished(t)

	// The Deployment runs its replicas on the fake nodes (its
	// ServiceAccount exists, or admission would refuse its pods), and the
	// PodDisruptionBudget covers them.
	deploy := typed[appsv1.Deployment](t, objects, "Deployment")
	if image := managerContainer(t, &deploy).Image; image != testImage {
		t.Errorf("the installer's manager image is %s, want %s", image, testImage)
	}
	eventually(t, 60*time.Second, "the manager Deployment available", func() (bool, error) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(&deploy), &deploy)
		return err == nil && deploy.Status.AvailableReplicas == *deploy.Spec.Replicas, err
	})
	pdb := typed[policyv1.PodDisruptionBudget](t, objects, "PodDisruptionBudget")
	eventually(t, 30*time.Second, "the PodDisruptionBudget to count the manager pods", func() (bool, error) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(&pdb), &pdb)
		return err == nil && pdb.Status.ExpectedPods == *deploy.Spec.Replicas && pdb.Status.DisruptionsAllowed >= 1, err
	})

	runAsDeployed(t, &deploy)
}

// runAsDeployed runs the image's manager as a pod of deploy, checks it leads
// and works, and stops it as the kubelet would.
func runAsDeployed(t *testing.T, deploy *appsv1.Deployment) {
	ctx := t.Context()
	ns, spec := deploy.Namespace, deploy.Spec.Template.Spec

	// The Secret the documentation has users create, for this plane's Redis.
	createRedisSecret(t, ns)
	m := startManager(t, deploy)

	// It grants a lock to a pod: Redis, the API server and its RBAC all work.
	appNS, pod := createCandidate(t, "image-run-")
	lock := createLeaderLock(t, appNS, "leader")
	waitGranted(t, lock, pod)
	// Its finalizer releases the grant, so the lock goes.
	if err := k8s.Delete(ctx, lock); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the lock deleted", func() (bool, error) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(lock), lock)
		return apierrors.IsNotFound(err), err
	})

	// SIGTERM, as the kubelet stops a pod: the manager stops within the
	// pod's grace period, releasing the Lease for a standby.
	if code := m.Stop(t, time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second); code != 0 {
		t.Errorf("the manager exited %d on SIGTERM", code)
	}
	lease := &coordinationv1.Lease{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "lockwarden-manager.lockwarden.dev"}, lease); err != nil || (lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "") {
		t.Errorf("the Lease is still held after the manager stopped: %v %v", lease.Spec.HolderIdentity, err)
	}
}

// createRedisSecret creates the Secret the documentation has users create, for
// this plane's Redis.
func createRedisSecret(t *testing.T, ns string) {
	t.Helper()
	if err := k8s.Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lockwarden-redis"},
		StringData: map[string]string{"url": "redis://" + redisSrv.Addr + "/0", "password": ""},
	}); err != nil {
		t.Fatal(err)
	}
}

// startManager runs the image's manager as a pod of deploy and waits until
// it is ready, alive by the Deployment's own probes, and leads.
func startManager(t *testing.T, deploy *appsv1.Deployment) *podrun.Process {
	t.Helper()
	// The Deployment's ports are the pod's own; here the manager shares the
	// host's network with other tests, so it listens on free loopback ports
	// (the last of a repeated flag wins).
	probes, metrics := freeAddr(t), freeAddr(t)
	// A pod of the Deployment's template, not created: it has no name yet.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: deploy.Namespace}, Spec: deploy.Spec.Template.Spec}
	m := startContainer(t, pod, "manager",
		"--health-probe-bind-address="+probes, "--metrics-bind-address="+metrics)
	container := managerContainer(t, deploy)
	for _, probe := range []*corev1.Probe{container.ReadinessProbe, container.LivenessProbe} {
		u := "http://" + probes + probe.HTTPGet.Path
		eventually(t, 30*time.Second, "GET "+u, func() (bool, error) {
			resp, err := http.Get(u)
			if err != nil {
				return false, err
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, fmt.Errorf("status %s", resp.Status)
		})
	}
	lease := &coordinationv1.Lease{}
	eventually(t, 30*time.Second, "the manager to take the leader-election Lease", func() (bool, error) {
		err := k8s.Get(t.Context(), client.ObjectKey{Namespace: deploy.Namespace, Name: "lockwarden-manager.lockwarden.dev"}, lease)
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "", fmt.Errorf("lease %+v: %w", lease.Spec, err)
	})
	return m
}

// createCandidate creates a namespace of the given prefix with a running
// pod labelled app: candidate.
func createCandidate(t *testing.T, prefix string) (string, *corev1.Pod) {
	t.Helper()
	ctx := t.Context()
	appNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	if err := k8s.Create(ctx, appNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), appNS) })
	if err := plane.WaitForServiceAccount(ctx, clientset, appNS.Name); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: appNS.Name, Name: "app", Labels: map[string]string{"app": "candidate"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
	}
	if err := k8s.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	return appNS.Name, pod
}

// createLeaderLock creates a lock selecting the namespace's candidates.
func createLeaderLock(t *testing.T, ns, name string) *locksv1.DistributedLock {
	t.Helper()
	lock := &locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       locksv1.DistributedLockSpec{Candidates: &locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"app": "candidate"}}},
	}
	if err := k8s.Create(t.Context(), lock); err != nil {
		t.Fatal(err)
	}
	return lock
}

// waitGranted waits until the lock is granted to the pod.
func waitGranted(t *testing.T, lock *locksv1.DistributedLock, pod *corev1.Pod) {
	t.Helper()
	eventually(t, 30*time.Second, "the lock granted to the pod", func() (bool, error) {
		err := k8s.Get(t.Context(), client.ObjectKeyFromObject(lock), lock)
		return err == nil && lock.Status.Holder != nil && lock.Status.Holder.PodName == pod.Name, err
	})
}

// buildInstaller runs make build-installer with the image and returns the
// installer.
func buildInstaller(t *testing.T, image string, makeArgs ...string) []byte {
	t.Helper()
	file := filepath.Join(t.TempDir(), "install.yaml")
	mustMake(t, append([]string{"build-installer", "IMG=" + image, "INSTALLER=" + file}, makeArgs...)...)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func managerContainer(t *testing.T, deploy *appsv1.Deployment) *corev1.Container {
	t.Helper()
	for i, c := range deploy.Spec.Template.Spec.Containers {
		if c.Name == "manager" {
			return &deploy.Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatalf("the Deployment %s has no manager container", deploy.Name)
	return nil
}

func waitEstablished(t *testing.T) {
	t.Helper()
	eventually(t, 30*time.Second, "the CRD established", func() (bool, error) {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := k8s.Get(t.Context(), client.ObjectKey{Name: crdName}, &crd); err != nil {
			return false, err
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, errors.New("not established")
	})
}

// typed converts the only object of kind in objects, failing on fields the
// type lacks.
func typed[T any](t *testing.T, objects []*unstructured.Unstructured, kind string) T {
	t.Helper()
	var out T
	var found []*unstructured.Unstructured
	for _, obj := range objects {
		if obj.GetKind() == kind {
			found = append(found, obj)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s, want 1", len(found), kind)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(found[0].Object, &out, true); err != nil {
		t.Fatal(err)
	}
	return out
}

func decodeYAML(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	objects, err := manifests.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	return objects
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
}
