package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/lockwarden/lockwarden/internal/manifests"
)

// TestManagerDeployment checks what config/default promises about running
// the manager: it outlives its graceful shutdown, keeps a replica through
// drains, spreads across nodes, exposes its metrics port through the
// metrics Service and reads the Redis password from a file mounted from the
// Secret. controllers/manifests_test.go submits the same objects to an API
// server.
func TestManagerDeployment(t *testing.T) {
	var (
		deploy  appsv1.Deployment
		pdb     policyv1.PodDisruptionBudget
		svc     corev1.Service
		configs = map[string]corev1.ConfigMap{}
	)
	for _, obj := range kustomizeBuild(t, filepath.Join("..", "..", "config", "default")) {
		switch obj.GetKind() {
		case "Deployment":
			strictFrom(t, obj, &deploy)
		case "PodDisruptionBudget":
			strictFrom(t, obj, &pdb)
		case "Service":
			strictFrom(t, obj, &svc)
		case "ConfigMap":
			var cm corev1.ConfigMap
			strictFrom(t, obj, &cm)
			configs[cm.Name] = cm
		}
	}
	pod := deploy.Spec.Template.Spec
	podLabels := labels.Set(deploy.Spec.Template.Labels)

	// Unset fields read as 0: both the API's default of 30s grace and an
	// absent minAvailable fail here.
	var grace int64
	if pod.TerminationGracePeriodSeconds != nil {
		grace = *pod.TerminationGracePeriodSeconds
	}
	if time.Duration(grace)*time.Second <= gracefulShutdownTimeout {
		t.Errorf("terminationGracePeriodSeconds = %d, want above the manager's graceful shutdown of %v", grace, gracefulShutdownTimeout)
	}

	replicas, minAvailable := int32(1), 0
	if deploy.Spec.Replicas != nil {
		replicas = *deploy.Spec.Replicas
	}
	if pdb.Spec.MinAvailable != nil {
		minAvailable = pdb.Spec.MinAvailable.IntValue()
	}
	if minAvailable < 1 || int32(minAvailable) >= replicas {
		t.Errorf("PodDisruptionBudget minAvailable %d with %d replicas: want at least 1 and fewer than the replicas, so drains can proceed", minAvailable, replicas)
	}
	if !selects(t, pdb.Spec.Selector, podLabels) {
		t.Errorf("the PodDisruptionBudget selector %v does not select the manager pods %v", pdb.Spec.Selector, podLabels)
	}

	var spread bool
	if pod.Affinity != nil && pod.Affinity.PodAntiAffinity != nil {
		for _, term := range pod.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			spread = spread || (term.PodAffinityTerm.TopologyKey == corev1.LabelHostname && selects(t, term.PodAffinityTerm.LabelSelector, podLabels))
		}
	}
	if !spread {
		t.Errorf("no preferred pod anti-affinity of the manager pods across %s: %+v", corev1.LabelHostname, pod.Affinity)
	}

	// The metrics Service reaches the port the manager serves metrics on,
	// over HTTPS.
	c := pod.Containers[0]
	metricsPort := ""
	for _, arg := range c.Args {
		if addr, ok := strings.CutPrefix(arg, "--metrics-bind-address="); ok {
			_, metricsPort, _ = strings.Cut(addr, ":")
		}
	}
	var served bool
	for _, sp := range svc.Spec.Ports {
		for _, cp := range c.Ports {
			served = served || (sp.Name == "https" && sp.TargetPort.String() == cp.Name && fmt.Sprint(cp.ContainerPort) == metricsPort)
		}
	}
	if !served || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || len(svc.Spec.Selector) == 0 {
		t.Errorf("the metrics Service %s (ports %+v, selector %v) does not reach the manager's metrics port %q (container ports %+v)",
			svc.Name, svc.Spec.Ports, svc.Spec.Selector, metricsPort, c.Ports)
	}

	// REDIS_PASSWORD_FILE must name the password key of the Secret's volume,
	// and REDIS_PASSWORD must be absent: the manager refuses both.
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			continue
		}
		cm, ok := configs[from.ConfigMapRef.Name]
		if !ok {
			t.Fatalf("envFrom names the ConfigMap %s, which config/default lacks", from.ConfigMapRef.Name)
		}
		for k, v := range cm.Data {
			env[k] = v
		}
	}
	for _, e := range c.Env {
		if e.Name == envRedisPassword {
			t.Errorf("%s is set; the manager takes the password from %s", envRedisPassword, envRedisPasswordFile)
		}
	}
	file := env[envRedisPasswordFile]
	var mounted bool
	for _, m := range c.VolumeMounts {
		rel, err := filepath.Rel(m.MountPath, file)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.Secret == nil || v.Secret.SecretName != "lockwarden-redis" {
				continue
			}
			for _, item := range v.Secret.Items {
				mounted = mounted || (item.Key == "password" && item.Path == rel && (v.Secret.Optional == nil || !*v.Secret.Optional))
			}
		}
	}
	if !mounted {
		t.Errorf("%s=%q is not the password key of a mounted, required lockwarden-redis Secret volume", envRedisPasswordFile, file)
	}
}

func selects(t *testing.T, sel *metav1.LabelSelector, set labels.Set) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return sel != nil && !s.Empty() && s.Matches(set)
}

// strictFrom converts obj, failing on a field the type does not have, so a
// misspelt or misplaced field in config/ is caught here rather than
// dropped by the API server.
func strictFrom(t *testing.T, obj *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(obj.Object, into, true); err != nil {
		t.Fatalf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
	}
}

// kustomizeBuild runs bin/kustomize (built by `make kustomize` if missing).
func kustomizeBuild(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	kustomize := filepath.Join("..", "..", "bin", "kustomize")
	if _, err := os.Stat(kustomize); err != nil {
		if out, err := exec.Command("make", "-C", filepath.Join("..", ".."), "kustomize").CombinedOutput(); err != nil {
			t.Fatalf("make kustomize: %v\n%s", err, out)
		}
	}
	out, err := exec.Command(kustomize, "build", dir).Output()
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	objects, err := manifests.Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	return objects
}
