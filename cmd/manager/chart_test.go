package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/lockwarden/lockwarden/internal/manifests"
)

// chartDir is the Helm chart, in kubebuilder's helm plugin layout.
var chartDir = filepath.Join("..", "..", "dist", "chart")

// kubeVersion is the Kubernetes version the chart is rendered for without a
// cluster: the local plane's. bin/helm, built with go install, would
// otherwise assume 1.20, below the chart's kubeVersion.
const kubeVersion = "1.36.0"

// TestChartMatchesConfigDefault lints the chart and renders it with its
// default values: it must hold the objects config/default holds, by kind
// and name, and each the same apart from labels and annotations (Helm's
// own), so the chart cannot drift from the kustomize install. Three
// differences are by design: the Namespace is Helm's (--create-namespace),
// kustomize's ConfigMap name carries a content hash, and helm test's pod is
// the chart's alone. The manager's
// flags may differ only by the chart passing more of them.
func TestChartMatchesConfigDefault(t *testing.T) {
	helm(t, "lint", "--strict", "--kube-version", kubeVersion, chartDir)
	compareChartWithKustomize(t, helmTemplate(t), kustomizeBuild(t, filepath.Join("..", "..", "config", "default")))
}

// compareChartWithKustomize checks that the chart rendered the objects
// kustomize built, as TestChartMatchesConfigDefault describes.
func compareChartWithKustomize(t *testing.T, rendered, built []*unstructured.Unstructured) {
	t.Helper()
	want := map[string]*unstructured.Unstructured{}
	for _, obj := range built {
		if obj.GetKind() == "Namespace" {
			continue
		}
		want[objectKey(obj)] = obj
	}
	got := map[string]*unstructured.Unstructured{}
	for _, obj := range rendered {
		if obj.GetAnnotations()["helm.sh/hook"] == "test" {
			continue // helm test's pod, which runs only under helm test
		}
		got[objectKey(obj)] = obj
	}
	if !reflect.DeepEqual(sortedKeys(got), sortedKeys(want)) {
		t.Fatalf("the chart renders\n  %v\nkustomize builds\n  %v", sortedKeys(got), sortedKeys(want))
	}
	for key, w := range want {
		g := got[key]
		if w.GetKind() == "Deployment" {
			var gd, wd appsv1.Deployment
			strictFrom(t, g, &gd)
			strictFrom(t, w, &wd)
			gotArgs, wantArgs := gd.Spec.Template.Spec.Containers[0].Args, wd.Spec.Template.Spec.Containers[0].Args
			for _, arg := range wantArgs {
				if !slices.Contains(gotArgs, arg) {
					t.Errorf("the chart's manager lacks %s: %v", arg, gotArgs)
				}
			}
			checkManagerArgs(t, gotArgs)
			unstructured.RemoveNestedField(g.Object, "spec", "template", "spec", "containers")
			unstructured.RemoveNestedField(w.Object, "spec", "template", "spec", "containers")
			gd.Spec.Template.Spec.Containers[0].Args, wd.Spec.Template.Spec.Containers[0].Args = nil, nil
			for _, from := range wd.Spec.Template.Spec.Containers[0].EnvFrom {
				if from.ConfigMapRef != nil {
					from.ConfigMapRef.Name = configMapHash.ReplaceAllString(from.ConfigMapRef.Name, "")
				}
			}
			if !reflect.DeepEqual(gd.Spec.Template.Spec.Containers, wd.Spec.Template.Spec.Containers) {
				t.Errorf("the manager container differs:\nchart:     %+v\nkustomize: %+v", gd.Spec.Template.Spec.Containers, wd.Spec.Template.Spec.Containers)
			}
		}
		for _, o := range []*unstructured.Unstructured{g, w} {
			unstructured.RemoveNestedField(o.Object, "metadata", "labels")
			unstructured.RemoveNestedField(o.Object, "metadata", "annotations")
			o.SetName(configMapHash.ReplaceAllString(o.GetName(), ""))
		}
		if !reflect.DeepEqual(g.Object, w.Object) {
			t.Errorf("%s differs:\nchart:     %v\nkustomize: %v", key, g.Object, w.Object)
		}
	}
}

// TestChartValues renders the chart with other values and checks they
// reach the objects, and that the manager accepts the flags it gets.
func TestChartValues(t *testing.T) {
	objects := helmTemplate(t,
		"--set", "manager.replicas=1",
		"--set", "manager.maxConcurrentReconciles=8",
		"--set", "manager.sharedKeys={nightly=a\\,b}",
		"--set", "manager.podLabelSelector=lockwarden.dev/candidate=true",
		"--set", "manager.image.repository=registry.example/lockwarden",
		"--set", "manager.image.tag=v1.2.3",
		"--set", "redis.secretName=my-redis",
		"--set", "leaderElection.leaseDuration=8s",
		"--set", "leaderElection.renewDeadline=5s",
		"--set", "leaderElection.retryPeriod=1s",
		"--set", "metrics.enable=false",
		"--set", "crd.enable=false",
	)
	var deploy appsv1.Deployment
	kinds := map[string]int{}
	for _, obj := range objects {
		kinds[obj.GetKind()]++
		if obj.GetKind() == "Deployment" {
			strictFrom(t, obj, &deploy)
		}
		if obj.GetKind() == "Service" || obj.GetName() == "lockwarden-metrics-reader" {
			t.Errorf("metrics.enable=false still renders %s %s", obj.GetKind(), obj.GetName())
		}
	}
	if kinds["PodDisruptionBudget"] != 0 || kinds["CustomResourceDefinition"] != 0 {
		t.Errorf("one replica and crd.enable=false still render %v", kinds)
	}
	pod := deploy.Spec.Template.Spec
	c := pod.Containers[0]
	if *deploy.Spec.Replicas != 1 || c.Image != "registry.example/lockwarden:v1.2.3" ||
		pod.Volumes[0].Secret.SecretName != "my-redis" || c.Env[0].ValueFrom.SecretKeyRef.Name != "my-redis" {
		t.Errorf("values not applied: replicas %d, image %s, volumes %+v, env %+v", *deploy.Spec.Replicas, c.Image, pod.Volumes, c.Env)
	}
	o := checkManagerArgs(t, c.Args)
	if o.maxConcurrentReconciles != 8 || o.lease.String() != "8s" || o.renew.String() != "5s" || o.retry.String() != "1s" || o.metricsAddr != "0" {
		t.Errorf("flags not applied: %v", c.Args)
	}
	if !o.keys.Permits("b", "nightly") || o.keys.Permits("c", "nightly") {
		t.Errorf("--shared-key not applied: %v", c.Args)
	}
	if sel, err := o.pods(); err != nil || sel.String() != "lockwarden.dev/candidate=true" {
		t.Errorf("--pod-label-selector not applied: %v (%v)", c.Args, err)
	}
}

// checkManagerArgs parses args as the manager would, and fails the test
// if the manager would refuse them.
func checkManagerArgs(t *testing.T, args []string) *options {
	t.Helper()
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o, _ := allFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("the manager refuses the chart's flags %v: %v", args, err)
	}
	if err := o.validate(); err != nil {
		t.Fatalf("the manager refuses the chart's flags %v: %v", args, err)
	}
	return o
}

// configMapHash is the content hash kustomize's configMapGenerator appends.
var configMapHash = regexp.MustCompile(`-[a-z0-9]{10}$`)

func objectKey(obj *unstructured.Unstructured) string {
	name := obj.GetName()
	if obj.GetKind() == "ConfigMap" {
		name = configMapHash.ReplaceAllString(name, "")
	}
	return fmt.Sprintf("%s %s/%s", obj.GetKind(), obj.GetNamespace(), name)
}

func sortedKeys(m map[string]*unstructured.Unstructured) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// helmTemplate renders the chart as release "lockwarden" in
// config/default's namespace, with extra helm arguments.
func helmTemplate(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	return helmTemplateAs(t, "lockwarden", args...)
}

// helmTemplateAs renders the chart as the named release.
func helmTemplateAs(t *testing.T, release string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out := helm(t, append([]string{"template", release, chartDir, "--namespace", "lockwarden-system", "--kube-version", kubeVersion}, args...)...)
	objects, err := manifests.Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	return objects
}

// helm runs bin/helm (built by `make helm` if missing) and returns its
// standard output.
func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	bin := filepath.Join("..", "..", "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		if out, err := exec.Command("make", "-C", filepath.Join("..", ".."), "helm").CombinedOutput(); err != nil {
			t.Fatalf("make helm: %v\n%s", err, out)
		}
	}
	cmd := exec.Command(bin, args...)
	// No helm configuration or cache from the test's own environment.
	home := t.TempDir()
	cmd.Env = []string{"HOME=" + home, "HELM_CACHE_HOME=" + home, "HELM_CONFIG_HOME=" + home, "HELM_DATA_HOME=" + home}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %v: %v\n%s%s", args, err, out, stderr.String())
	}
	return out
}
