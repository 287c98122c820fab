package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/envtestassets"
	"github.com/lockwarden/lockwarden/internal/redistest"
)

// TestMetricsEndpoint runs the manager binary with its default metrics
// flags against a real API server (envtest), as config/default's
// ServiceAccount with config/default's RBAC, and scrapes it: the endpoint
// answers HTTPS only to a caller whose token the API server authenticates
// (TokenReview) and authorizes for GET /metrics (SubjectAccessReview, the
// metrics-reader ClusterRole). The manager may ask only because of
// config/rbac's metrics-auth-role, so the test also proves that role is
// enough. Lock metrics carry no lock names by default.
func TestMetricsEndpoint(t *testing.T) {
	ctx := context.Background()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	if env.BinaryAssetsDirectory, err = envtestassets.Dir(ctx, root, os.Stderr); err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, locksv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	clientset := kubernetes.NewForConfigOrDie(cfg)
	create := func(obj client.Object) {
		t.Helper()
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatalf("%T %s: %v", obj, obj.GetName(), err)
		}
	}

	// config/default's namespace, ServiceAccount and RBAC, as installed.
	for _, obj := range kustomizeBuild(t, filepath.Join(root, "config", "default")) {
		switch obj.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			create(obj)
		}
	}
	// A scraper bound to metrics-reader, and one bound to nothing.
	scrapers := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "monitoring"}}
	create(scrapers)
	for _, name := range []string{"prometheus", "nosy"} {
		create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: scrapers.Name, Name: name}})
	}
	create(&rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-lockwarden-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "lockwarden-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: scrapers.Name, Name: "prometheus"}},
	})

	// The manager, as its ServiceAccount, with the Deployment's metrics
	// flags and otherwise the defaults: HTTPS, authenticated, authorized.
	kubeconfig := writeKubeconfig(t, cfg, serviceAccountToken(t, clientset, "lockwarden-system", "lockwarden-controller-manager"))
	srv := redistest.Start(t)
	metricsAddr, probeAddr := freeAddr(t), freeAddr(t)
	startManager(t, []string{"REDIS_URL=redis://" + srv.Addr + "/0"},
		"--kubeconfig="+kubeconfig, "--metrics-bind-address="+metricsAddr, "--health-probe-bind-address="+probeAddr)

	// A lock, so the lock metrics have a series.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a"}}
	create(ns)
	create(&locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "secret-project-leader"},
		Spec:       locksv1.DistributedLockSpec{Candidates: &locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"app": "x"}}},
	})

	url := "https://" + metricsAddr + "/metrics"
	// The manager's certificate is self-signed (no --metrics-cert-path), as
	// with the scaffold's default; this test checks who is let in, not the
	// certificate.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(token string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	scrape := func(token string) (int, string) {
		t.Helper()
		code, body, err := get(token)
		if err != nil {
			t.Fatal(err)
		}
		return code, body
	}
	// Until the manager serves; the bound only keeps a broken manager from
	// hanging the test.
	deadline := time.Now().Add(30 * time.Second)
	for _, _, err := get(""); err != nil; _, _, err = get("") {
		if time.Now().After(deadline) {
			t.Fatalf("the metrics endpoint does not answer: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if code, _ := scrape(""); code != http.StatusUnauthorized {
		t.Errorf("no token: HTTP %d, want 401", code)
	}
	// controller-runtime's filter answers a token the TokenReview rejects
	// with 500, not 401; what matters is that no metrics are served.
	if code, body := scrape("not-a-token"); code == http.StatusOK || strings.Contains(body, "lockwarden_") {
		t.Errorf("a bad token: HTTP %d, metrics served", code)
	}
	if code, _ := scrape(serviceAccountToken(t, clientset, scrapers.Name, "nosy")); code != http.StatusForbidden {
		t.Errorf("a ServiceAccount without metrics-reader: HTTP %d, want 403", code)
	}
	reader := serviceAccountToken(t, clientset, scrapers.Name, "prometheus")
	held := regexp.MustCompile(`(?m)^lockwarden_lock_held\{namespace="tenant-a"\} 0$`)
	var body string
	deadline = time.Now().Add(30 * time.Second)
	for {
		var code int
		code, body = scrape(reader)
		if code != http.StatusOK {
			t.Fatalf("a ServiceAccount bound to metrics-reader: HTTP %d, want 200:\n%s", code, body)
		}
		if held.MatchString(body) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lockwarden_lock_held series for tenant-a:\n%s", body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, want := range []string{"redislock_renewals_total", "controller_runtime_reconcile_total"} {
		if !strings.Contains(body, want) {
			t.Errorf("the metrics lack %s", want)
		}
	}
	if strings.Contains(body, "secret-project-leader") {
		t.Errorf("the metrics name a lock without --metrics-lock-names:\n%s", body)
	}
}

// serviceAccountToken asks the API server for a token of the
// ServiceAccount (TokenRequest), as the kubelet does for a pod.
func serviceAccountToken(t *testing.T, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// writeKubeconfig writes a kubeconfig for the API server of cfg that
// authenticates with token.
func writeKubeconfig(t *testing.T, cfg *rest.Config, token string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["sa"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "sa"}
	kc.CurrentContext = "sa"
	file := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, file); err != nil {
		t.Fatal(err)
	}
	return file
}

// startManager runs the manager binary until the test ends, then stops it
// with SIGTERM as the kubelet would. Its output is shown if the test fails.
func startManager(t *testing.T, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command(managerBin, args...)
	cmd.Env = append([]string{"HOME=" + t.TempDir()}, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(gracefulShutdownTimeout + 5*time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("manager output:\n%s", out.String())
		}
	})
}

// freeAddr is a loopback address with a port free at the time of asking.
func freeAddr(t *testing.T) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
}
