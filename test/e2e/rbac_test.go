package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// TestAggregatedRoles installs config/rbac's admin, editor and viewer roles
// for DistributedLocks and checks them through Kubernetes' own "admin",
// "edit" and "view" ClusterRoles: the plane's kube-controller-manager runs
// the clusterrole-aggregation controller, which envtest alone lacks, so the
// labels are tested, not only the rules. Users act through impersonation,
// so the API server's RBAC authorizer decides, as for a real user.
func TestAggregatedRoles(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"admin", "editor", "viewer"} {
		role := readClusterRole(t, filepath.Join("..", "..", "config", "rbac", "distributedlock_"+name+"_role.yaml"))
		if err := k8s.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	ns, err := clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-rbac-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	users := map[string]string{"ann": "admin", "ed": "edit", "vi": "view"}
	for user, role := range users {
		binding := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
		}
		if err := k8s.Create(ctx, binding); err != nil {
			t.Fatal(err)
		}
	}
	// Aggregation is asynchronous: wait until each built-in role has
	// picked up its part (read access, which all three get).
	for user := range users {
		eventually(t, 30*time.Second, user+" may list distributedlocks", func() (bool, error) {
			return allowed(ctx, user, ns.Name, "list")
		})
	}

	lock := func(name string) *locksv1.DistributedLock {
		return &locksv1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name},
			Spec:       locksv1.DistributedLockSpec{Candidates: &locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"app": "x"}}},
		}
	}
	as := func(user string) client.Client {
		cfg := rest.CopyConfig(pl.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
		c, err := client.New(cfg, client.Options{Scheme: k8s.Scheme()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	expect := func(user, what string, err error, wantForbidden bool) {
		t.Helper()
		switch {
		case wantForbidden && !apierrors.IsForbidden(err):
			t.Errorf("%s (%s) %s: error %v, want Forbidden", user, users[user], what, err)
		case !wantForbidden && err != nil:
			t.Errorf("%s (%s) %s: %v", user, users[user], what, err)
		}
	}

	ed, vi, ann := as("ed"), as("vi"), as("ann")
	expect("ed", "creates a lock", ed.Create(ctx, lock("by-ed")), false)
	var got locksv1.DistributedLock
	expect("ed", "reads it", ed.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "by-ed"}, &got), false)
	// A patch, not an update: the manager adds its finalizer meanwhile.
	before := got.DeepCopy()
	got.Spec.DeleteUnstarted = true
	expect("ed", "changes it", ed.Patch(ctx, &got, client.MergeFrom(before)), false)
	expect("ed", "writes its status", ed.Status().Update(ctx, &got), true)

	var list locksv1.DistributedLockList
	expect("vi", "lists locks", vi.List(ctx, &list, client.InNamespace(ns.Name)), false)
	expect("vi", "reads a lock", vi.Get(ctx, client.ObjectKeyFromObject(&got), &locksv1.DistributedLock{}), false)
	expect("vi", "creates a lock", vi.Create(ctx, lock("by-vi")), true)
	expect("vi", "deletes a lock", vi.Delete(ctx, &got), true)

	expect("ann", "creates a lock", ann.Create(ctx, lock("by-ann")), false)
	expect("ann", "deletes every lock", ann.DeleteAllOf(ctx, &locksv1.DistributedLock{}, client.InNamespace(ns.Name)), false)
	expect("ed", "deletes every lock", ed.DeleteAllOf(ctx, &locksv1.DistributedLock{}, client.InNamespace(ns.Name)), true)

	// The roles grant nothing outside the namespace they are bound in.
	if ok, err := allowed(ctx, "ed", "default", "create"); err != nil || ok {
		t.Errorf("ed may create locks in default: %v, %v", ok, err)
	}
}

// allowed asks the API server whether user may do verb on distributedlocks
// in ns.
func allowed(ctx context.Context, user, ns, verb string) (bool, error) {
	review, err := clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: verb, Group: locksv1.GroupVersion.Group, Resource: "distributedlocks",
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return review.Status.Allowed, nil
}

func readClusterRole(t *testing.T, file string) *rbacv1.ClusterRole {
	t.Helper()
	role := &rbacv1.ClusterRole{}
	decodeFile(t, file, role)
	if role.Name == "" || len(role.Labels) == 0 {
		t.Fatalf("%s: no ClusterRole with aggregation labels", file)
	}
	return role
}

// decodeFile decodes the first object of a YAML (or JSON) file into obj.
func decodeFile(t *testing.T, file string, obj any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(obj); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("%s: %v", file, err)
	}
}
