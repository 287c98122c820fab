// Package e2e runs the lockwarden manager, as a process built from
// cmd/manager, against the local control plane (internal/plane) and a
// redis-server, and checks what the lock promises from the pods' own
// timestamps: never two guarded pods running at once per key.
package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/plane"
	"github.com/lockwarden/lockwarden/internal/redistest"
)

// Shared by every test: one plane, one Redis, one manager.
var (
	pl        *plane.Plane
	clientset *kubernetes.Clientset
	k8s       client.Client
	redisSrv  *redistest.Server
	mgr       *manager
	pods      *podRecorder
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp("", "lockwarden-e2e-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)

	// The manager binary builds while the plane starts.
	managerBin := filepath.Join(dir, "manager")
	built := make(chan error, 1)
	go func() {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", managerBin, "./cmd/manager")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			built <- fmt.Errorf("go build ./cmd/manager: %w\n%s", err, out)
			return
		}
		built <- nil
	}()

	pl, err = plane.Start(ctx, plane.Options{
		CRDDirectoryPaths: []string{filepath.Join(root, "config", "crd", "bases")},
		Progress:          os.Stderr,
	})
	if err != nil {
		return fail(err)
	}
	defer pl.Stop()
	if clientset, err = kubernetes.NewForConfig(pl.Config); err != nil {
		return fail(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fail(err)
	}
	if err := locksv1.AddToScheme(scheme); err != nil {
		return fail(err)
	}
	if k8s, err = client.New(pl.Config, client.Options{Scheme: scheme}); err != nil {
		return fail(err)
	}
	pods = startPodRecorder(clientset)
	defer pods.stop()

	if redisSrv, err = redistest.StartServer(dir); err != nil {
		return fail(err)
	}
	defer redisSrv.Stop()

	// The manager runs as a user of its own with only the ClusterRole in
	// config/rbac/role.yaml, as in a real install.
	kubectl := func(args ...string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(pl.AssetsDir, "kubectl"), append([]string{"--kubeconfig", pl.Kubeconfig}, args...)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("kubectl %v: %w\n%s", args, err, out)
		}
		return nil
	}
	if err := kubectl("apply", "-f", filepath.Join("config", "rbac", "role.yaml")); err != nil {
		return fail(err)
	}
	// The admission policies an install ships (config/default has them):
	// among them, the API server refuses a stale manager's lift of a gate.
	if err := kubectl("apply", "-k", filepath.Join("config", "admission")); err != nil {
		return fail(err)
	}
	if err := kubectl("create", "clusterrolebinding", "lockwarden-manager", "--clusterrole=manager-role", "--user=lockwarden-manager"); err != nil {
		return fail(err)
	}
	user, err := pl.Env.AddUser(envtest.User{Name: "lockwarden-manager"}, nil)
	if err != nil {
		return fail(err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return fail(err)
	}
	managerKubeconfig := filepath.Join(dir, "manager.kubeconfig")
	if err := os.WriteFile(managerKubeconfig, data, 0o600); err != nil {
		return fail(err)
	}

	if err := <-built; err != nil {
		return fail(err)
	}
	mgr = &manager{bin: managerBin, kubeconfig: managerKubeconfig, redisURL: "redis://" + redisSrv.Addr, log: filepath.Join(dir, "manager.log")}
	if err := mgr.start(ctx); err != nil {
		return fail(err)
	}
	defer mgr.stop()

	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "manager log (last lines):\n%s\n", tailFile(mgr.log, 60))
	}
	return code
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "e2e setup:", err)
	return 1
}

// manager is the lockwarden manager process. Tests may kill and restart it;
// mu serialises that with the final stop.
type manager struct {
	bin, kubeconfig, redisURL, log string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

func (m *manager) start(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cmd, exited, probe, err := spawnManager(nil, []string{m.bin, "--kubeconfig", m.kubeconfig}, []string{"REDIS_URL=" + m.redisURL}, m.log, nil)
	if err != nil {
		return err
	}
	m.cmd, m.exited = cmd, exited
	return waitHealthy(ctx, "http://"+probe+"/readyz", exited, "the manager", m.log)
}

// spawnManager starts the manager, command (its binary and first
// arguments) run through wrapper if given (a command that ends by exec'ing
// it), with the metrics endpoint off and its probes on a free loopback
// port, which it returns; its output is appended to logPath, and env added
// to the test's environment. exited closes once it has exited and onExit,
// if set, has been called with its exit.
func spawnManager(wrapper, command, env []string, logPath string, onExit func(*exec.Cmd, error)) (*exec.Cmd, chan struct{}, string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, "", err
	}
	probe := net.JoinHostPort("127.0.0.1", strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	l.Close()
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, "", err
	}
	defer log.Close()
	args := append(append(slices.Clone(wrapper), command...), "--metrics-bind-address", "0", "--health-probe-bind-address", probe)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, nil, "", err
	}
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		if onExit != nil {
			onExit(cmd, err)
		}
		close(exited)
	}()
	return cmd, exited, probe, nil
}

// waitHealthy polls url until it answers 200, for up to 30s; who names the
// process in errors, with the last lines of its log.
func waitHealthy(ctx context.Context, url string, exited <-chan struct{}, who, logPath string) error {
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("%s exited at start-up:\n%s", who, tailFile(logPath, 40))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if resp, err := hc.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer %s within 30s:\n%s", who, url, tailFile(logPath, 40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill kills the manager with SIGKILL, as a crash or an OOM kill would.
func (m *manager) kill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		_ = m.cmd.Process.Kill()
		<-m.exited
		m.cmd = nil
	}
}

// stop stops the manager gracefully.
func (m *manager) stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
	m.cmd = nil
}

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := 0
	for i := len(data) - 1; i >= 0; i-- {
		if data[i] == '\n' {
			lines++
			if lines > n {
				return string(data[i+1:])
			}
		}
	}
	return string(data)
}
