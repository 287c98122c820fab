package main

import (
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/podrun"
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

// The manager itself, started with a password Redis refuses: it is
// unready (so a rollout waits and `helm install --wait` fails), and its log
// says that Redis refuses its credentials, without the password.
func TestManagerUnreadyWhileRedisRefusesItsCredentials(t *testing.T) {
	cfg, _ := apiServer(t)
	srv := redisWithUser(t, "right")
	admin := writeKubeconfig(t, cfg, &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData})
	probes := freeAddr(t)
	cmd := exec.Command(managerBin, "--kubeconfig="+admin, "--metrics-bind-address=0", "--health-probe-bind-address="+probes)
	cmd.Env = []string{"HOME=" + t.TempDir(), "REDIS_URL=redis://" + srv.Addr + "/0", "REDIS_USERNAME=lockwarden", "REDIS_PASSWORD=wrong-password"}
	var out podrun.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	status := func(path string) int {
		resp, err := http.Get("http://" + probes + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	deadline := time.Now().Add(30 * time.Second)
	for status("/healthz") != http.StatusOK || !strings.Contains(out.String(), "Redis refuses the manager's credentials") {
		if time.Now().After(deadline) {
			t.Fatalf("the manager did not serve its probes and log the refusal:\n%s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code := status("/readyz"); code != http.StatusInternalServerError {
		t.Errorf("/readyz answers %d while Redis refuses the credentials", code)
	}
	if strings.Contains(out.String(), "wrong-password") {
		t.Errorf("the password is in the log:\n%s", out.String())
	}
}
