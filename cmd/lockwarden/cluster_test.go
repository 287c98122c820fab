package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/envtestassets"
	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// cluster is what the CLI's cluster commands run against: an API server
// (envtest) with the CRD, a redis-server, and the lockwarden manager built
// from cmd/manager granting the locks, as in a real install.
type cluster struct {
	k8s client.Client
	// kubeconfig is an administrator's, its current context the API
	// server's ("envtest").
	kubeconfig string
	// admin is kubeconfig's content.
	admin *clientcmdapi.Config
	// assets is envtest's binary directory, kubectl among them.
	assets string
	redis  *redislock.Client
	dir    string
	log    string // the manager's
}

// One cluster for the package's tests that need one, started by the first
// of them and stopped by TestMain.
var (
	clusterOnce sync.Once
	shared      *cluster
	clusterErr  error
	clusterStop []func()
)

// testCluster returns the shared cluster, starting it on first use.
func testCluster(t *testing.T) *cluster {
	t.Helper()
	clusterOnce.Do(func() { shared, clusterErr = startCluster() })
	if clusterErr != nil {
		t.Fatal(clusterErr)
	}
	return shared
}

// stopCluster stops what startCluster started; after failed tests it
// prints the end of the manager's log.
func stopCluster(failed bool) {
	if failed && shared != nil {
		if b, err := os.ReadFile(shared.log); err == nil {
			lines := strings.Split(string(b), "\n")
			fmt.Fprintf(os.Stderr, "manager log (last lines):\n%s\n", strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	}
	for _, stop := range slices.Backward(clusterStop) {
		stop()
	}
}

func startCluster() (*cluster, error) {
	c := &cluster{}
	dir, err := os.MkdirTemp("", "lockwarden-cli-cluster")
	if err != nil {
		return nil, err
	}
	clusterStop = append(clusterStop, func() { _ = os.RemoveAll(dir) })
	c.dir, c.log = dir, filepath.Join(dir, "manager.log")

	// The manager builds while the API server starts.
	managerBin := filepath.Join(dir, "manager")
	built := make(chan error, 1)
	go func() {
		if out, err := exec.Command("go", "build", "-o", managerBin, "../manager").CombinedOutput(); err != nil {
			built <- fmt.Errorf("go build ../manager: %w\n%s", err, out)
			return
		}
		built <- nil
	}()

	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return nil, err
	}
	// envtest logs through controller-runtime's logger; the manager's log
	// is the one to read.
	ctrllog.SetLogger(logr.Discard())
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		// envtest's default, 20s, is too short for a loaded machine: a
		// bound on a hang, not a performance assertion.
		ControlPlaneStartTimeout: 2 * time.Minute,
	}
	if c.assets, err = envtestassets.Dir(context.Background(), root, os.Stderr); err != nil {
		return nil, err
	}
	env.BinaryAssetsDirectory = c.assets
	cfg, err := env.Start()
	if err != nil {
		return nil, err
	}
	clusterStop = append(clusterStop, func() { _ = env.Stop() })
	if c.k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	user, err := env.AddUser(envtest.User{Name: "cli-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	data, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	if c.admin, err = clientcmd.Load(data); err != nil {
		return nil, err
	}
	c.kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(c.kubeconfig, data, 0o600); err != nil {
		return nil, err
	}

	srv, err := redistest.StartServer(dir)
	if err != nil {
		return nil, err
	}
	clusterStop = append(clusterStop, srv.Stop)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	clusterStop = append(clusterStop, func() { _ = rdb.Close() })
	if c.redis, err = redislock.New(rdb, redislock.Options{}); err != nil {
		return nil, err
	}
	clusterStop = append(clusterStop, func() { _ = c.redis.Close() })

	if err := <-built; err != nil {
		return nil, err
	}
	log, err := os.Create(c.log)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	mgr := exec.Command(managerBin, "--kubeconfig", c.kubeconfig, "--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	mgr.Env = append(os.Environ(), "REDIS_URL=redis://"+srv.Addr)
	mgr.Stdout, mgr.Stderr = log, log
	mgr.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := mgr.Start(); err != nil {
		return nil, err
	}
	clusterStop = append(clusterStop, func() { _ = mgr.Process.Kill(); _ = mgr.Wait() })
	return c, nil
}

// lockName is the DistributedLock of a scenario, and the label value of
// its candidates.
const lockName = "nightly-report"

// scenario is a namespace where the manager granted lockName to the pod
// holder and the pod waiter waits behind it, first in line.
type scenario struct {
	ns, holder, waiter string
	key                string // the lock's Redis key
	holderUID          string
}

// newScenario sets up a scenario in the namespace ns ("" for a new one).
func (c *cluster) newScenario(t *testing.T, ns string) *scenario {
	t.Helper()
	ctx := context.Background()
	namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if ns == "" {
		namespace.GenerateName = "cli-"
	}
	if err := c.k8s.Create(ctx, namespace); err != nil {
		t.Fatal(err)
	}
	s := &scenario{ns: namespace.Name, holder: lockName + "-1", waiter: lockName + "-2", key: namespace.Name + "/" + lockName}
	for _, name := range []string{s.holder, s.waiter} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: name, Labels: map[string]string{"app": lockName}},
			Spec: corev1.PodSpec{
				SchedulingGates: []corev1.PodSchedulingGate{{Name: locksv1.GateFor(lockName)}},
				Containers:      []corev1.Container{{Name: "report", Image: "busybox"}},
			},
		}
		if err := c.k8s.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		// The manager lines candidates up by creation time, then name:
		// holder first.
		if name == s.holder {
			s.holderUID = string(pod.UID)
		}
	}
	lock := &locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: lockName},
		Spec: locksv1.DistributedLockSpec{
			Candidates: &locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"app": lockName}},
		},
	}
	if err := c.k8s.Create(ctx, lock); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the manager to grant "+s.holder+" and line up "+s.waiter, func() bool {
		st := c.lockStatus(t, s)
		return st.Holder != nil && st.Holder.PodName == s.holder && slices.Equal(st.Waiting, []string{s.waiter})
	})
	return s
}

func (c *cluster) lockStatus(t *testing.T, s *scenario) locksv1.DistributedLockStatus {
	t.Helper()
	lock := &locksv1.DistributedLock{}
	if err := c.k8s.Get(context.Background(), client.ObjectKey{Namespace: s.ns, Name: lockName}, lock); err != nil {
		t.Fatal(err)
	}
	return lock.Status
}

func (c *cluster) gates(t *testing.T, ns, pod string) []corev1.PodSchedulingGate {
	t.Helper()
	p := &corev1.Pod{}
	if err := c.k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: pod}, p); err != nil {
		t.Fatal(err)
	}
	return p.Spec.SchedulingGates
}

// cli runs the lockwarden binary with args and env added to the test's
// environment, and returns its exit status, stdout and stderr.
func cli(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	return runBinary(t, binary, env, args...)
}

func runBinary(t *testing.T, path string, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(path, args...)
	// No kubeconfig of the machine's: each test names its own.
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "KUBECONFIG=") }),
		append([]string{"HOME=" + t.TempDir(), "GORACE=atexit_sleep_ms=0"}, env...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		// A non-zero exit is an error here; the caller judges the code.
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
	case <-time.After(2 * hangGuard):
		_ = cmd.Process.Kill()
		t.Fatalf("%s %v did not exit within %v", filepath.Base(path), args, 2*hangGuard)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// wantOK fails the test unless the command exited 0.
func wantOK(t *testing.T, args []string, code int, stdout, stderr string) {
	t.Helper()
	if code != 0 {
		t.Fatalf("lockwarden %s: exit status %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout, stderr)
	}
}
