package main

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// `manager --check`, the chart's helm test, as the binary runs it: it
// passes with the right credentials and RBAC, and otherwise fails saying
// which check failed.
func TestCheck(t *testing.T) {
	cfg, _ := apiServer(t)
	srv := redisWithUser(t, "right")
	admin := writeKubeconfig(t, cfg, &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData})
	env := func(password string) []string {
		return []string{"REDIS_URL=redis://" + srv.Addr + "/0", "REDIS_USERNAME=lockwarden", "REDIS_PASSWORD=" + password}
	}

	out, code := runManagerCode(t, env("right"), "--check", "--kubeconfig="+admin)
	if code != 0 || !strings.Contains(out, "Redis accepts the manager's credentials") || !strings.Contains(out, "can read DistributedLocks cluster-wide") {
		t.Fatalf("--check with the right password and an administrator: exit %d\n%s", code, out)
	}
	out, code = runManagerCode(t, env("wrong"), "--check", "--kubeconfig="+admin)
	if code != 1 || !strings.Contains(out, "refuses the manager's credentials") || strings.Contains(out, "wrong") ||
		!strings.Contains(out, "can read DistributedLocks") {
		t.Fatalf("--check with a wrong password: exit %d (want 1, the Redis check failed, the others passed, the password not printed)\n%s", code, out)
	}
	out, code = runManagerCode(t, []string{"REDIS_URL=redis://127.0.0.1:1/0"}, "--check", "--kubeconfig="+admin)
	if code != 1 || !strings.Contains(out, "does not answer") {
		t.Fatalf("--check with no Redis there: exit %d\n%s", code, out)
	}

	// A ServiceAccount the API server knows but RBAC grants nothing: the
	// API checks fail, naming the kind and the scope; the Redis one passes.
	ctx := context.Background()
	_, c := apiServer(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "check-nobody"}}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "nobody"}}
	for _, obj := range []client.Object{ns, sa} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	nobody := writeKubeconfig(t, cfg, &clientcmdapi.AuthInfo{Token: serviceAccountToken(t, kubernetes.NewForConfigOrDie(cfg), ns.Name, sa.Name)})
	out, code = runManagerCode(t, env("right"), "--check", "--kubeconfig="+nobody, "--watch-namespaces=team-a")
	if code != 1 || !strings.Contains(out, "Redis accepts") || !strings.Contains(out, "may not list DistributedLocks in namespace team-a") ||
		!strings.Contains(out, "may not list pods in namespace team-a") || !strings.Contains(out, "2 check(s) failed") {
		t.Fatalf("--check as a ServiceAccount without RBAC: exit %d\n%s", code, out)
	}
}
