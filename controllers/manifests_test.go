package controllers_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/manifests"
)

// TestInstallManifests builds config/default with kustomize, checks what
// users rely on in it, and submits every object to the real API server.
func TestInstallManifests(t *testing.T) {
	objects := kustomizeBuild(t, filepath.Join("..", "config", "default"))
	byKind := map[string][]*unstructured.Unstructured{}
	for _, obj := range objects {
		byKind[obj.GetKind()] = append(byKind[obj.GetKind()], obj)
	}
	for _, kind := range []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment", "Service"} {
		if len(byKind[kind]) == 0 {
			t.Fatalf("config/default has no %s", kind)
		}
	}

	var deploy appsv1.Deployment
	fromUnstructured(t, byKind["Deployment"][0], &deploy)
	c := deploy.Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, "--leader-elect") {
		t.Errorf("manager args %v lack --leader-elect", c.Args)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("manager probes = %+v / %+v", c.LivenessProbe, c.ReadinessProbe)
	}
	for _, env := range c.Env {
		if env.Value != "" || env.ValueFrom == nil || env.ValueFrom.SecretKeyRef == nil || env.ValueFrom.SecretKeyRef.Name != "lockwarden-redis" {
			t.Errorf("env %s does not come from the lockwarden-redis Secret", env.Name)
		}
	}
	for _, arg := range c.Args {
		if strings.Contains(arg, "redis") {
			t.Errorf("a Redis setting is passed as a flag: %s", arg)
		}
	}

	// No role config/default installs, the manager's or the users', may
	// use a wildcard, create or delete pods, or read Secrets.
	for _, obj := range byKind["ClusterRole"] {
		var role rbacv1.ClusterRole
		fromUnstructured(t, obj, &role)
		for _, rule := range role.Rules {
			for _, field := range [][]string{rule.Verbs, rule.Resources, rule.APIGroups} {
				if slices.Contains(field, "*") {
					t.Errorf("ClusterRole %s rule %+v uses a wildcard", role.Name, rule)
				}
			}
			if slices.Contains(rule.Resources, "pods") && (slices.Contains(rule.Verbs, "delete") || slices.Contains(rule.Verbs, "create")) {
				t.Errorf("ClusterRole %s may create or delete pods: %+v", role.Name, rule)
			}
			if slices.Contains(rule.Resources, "secrets") {
				t.Errorf("ClusterRole %s may read Secrets: %+v", role.Name, rule)
			}
		}
	}

	ctx := context.Background()
	for _, obj := range objects { // kustomize puts the Namespace first
		opts := []client.PatchOption{client.FieldOwner("manifest-test"), client.ForceOwnership}
		if obj.GetKind() != "Namespace" { // the others only need to be accepted
			opts = append(opts, client.DryRunAll)
		}
		if err := k8s.Patch(ctx, obj, client.Apply, opts...); err != nil {
			t.Errorf("%s %s refused: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
}

// kustomizeBuild runs bin/kustomize (built by `make kustomize` if missing).
func kustomizeBuild(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	kustomize := filepath.Join("..", "bin", "kustomize")
	if _, err := os.Stat(kustomize); err != nil {
		if out, err := exec.Command("make", "-C", "..", "kustomize").CombinedOutput(); err != nil {
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

func fromUnstructured(t *testing.T, obj *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, into); err != nil {
		t.Fatal(err)
	}
}
