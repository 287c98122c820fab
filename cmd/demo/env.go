package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lockwarden/lockwarden/internal/plane"
	"github.com/lockwarden/lockwarden/internal/redistest"
)

// modulePath identifies the repository root: the directory whose go.mod
// declares it.
const modulePath = "github.com/lockwarden/lockwarden"

// env is everything the demo runs: a local control plane (internal/plane,
// with the CRD), a redis-server and the manager. close stops them in the
// reverse order of their start and removes the temporary directory.
type env struct {
	out  io.Writer
	root string // the repository
	dir  string // temporary: kubeconfigs, kubectl's cache, logs, redis files

	kubectl    string // the kubectl binary
	kubeconfig string // an administrator's kubeconfig, for kubectl
	redisAddr  string
	managerLog string
	plane      *plane.Plane

	cleanups []func()
}

// startEnv starts the control plane, Redis and the manager, printing what it
// does. On error, e.close still stops what was started.
func startEnv(ctx context.Context, e *env, opts options) error {
	root, err := findRoot()
	if err != nil {
		return err
	}
	e.root = root
	if e.dir, err = os.MkdirTemp("", "lockwarden-demo-"); err != nil {
		return err
	}
	dir := e.dir
	e.cleanups = append(e.cleanups, func() { _ = os.RemoveAll(dir) })

	manager, err := managerBinary(ctx, e.out, root, opts.manager)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	// The control plane: it builds its binaries first if they are missing.
	start := time.Now()
	pl, err := plane.Start(ctx, plane.Options{
		CRDDirectoryPaths: []string{filepath.Join(root, "config", "crd", "bases")},
		Progress:          e.out,
	})
	if err != nil {
		return fmt.Errorf("start the control plane: %w", err)
	}
	e.plane = pl
	e.cleanups = append(e.cleanups, pl.Stop)
	e.kubectl = filepath.Join(pl.AssetsDir, "kubectl")
	e.kubeconfig = pl.Kubeconfig
	// The manager runs as a user of its own, with only the ClusterRole in
	// config/rbac/role.yaml, bound below, as in a real install.
	managerUser, err := pl.Env.AddUser(envtest.User{Name: "lockwarden-manager"}, nil)
	if err != nil {
		return err
	}
	managerKubeconfig := filepath.Join(dir, "manager.kubeconfig")
	data, err := managerUser.KubeConfig()
	if err != nil {
		return err
	}
	if err := os.WriteFile(managerKubeconfig, data, 0o600); err != nil {
		return err
	}
	e.printf("control plane  etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok with nodes %s,\n",
		strings.Join(plane.NodeNames, " and "))
	e.printf("               at %s, DistributedLock CRD installed (%.1fs)\n", pl.Config.Host, time.Since(start).Seconds())
	if err := ctx.Err(); err != nil {
		return err
	}

	// Redis.
	redisDir := filepath.Join(dir, "redis")
	if err := os.MkdirAll(redisDir, 0o755); err != nil {
		return err
	}
	srv, err := redistest.StartServer(redisDir)
	if err != nil {
		return err
	}
	e.cleanups = append(e.cleanups, srv.Stop)
	e.redisAddr = srv.Addr
	e.printf("redis          redis-server at %s\n", e.redisAddr)

	// The manager's RBAC and the namespace of the story, with kubectl.
	e.printf("kubectl        %s, with KUBECONFIG=%s\n\n", e.rel(e.kubectl), e.kubeconfig)
	k := &kubectl{out: e.out, bin: e.kubectl, dir: root, env: e.kubectlEnv()}
	for _, args := range [][]string{
		{"apply", "-f", filepath.Join("config", "rbac", "role.yaml")},
		// The admission policies an install ships: the gate a pod's
		// lockwarden.dev/lock label asks for, and the fence on gate lifts.
		{"apply", "-k", filepath.Join("config", "admission")},
		{"create", "clusterrolebinding", "lockwarden-manager", "--clusterrole=manager-role", "--user=lockwarden-manager"},
		{"create", "namespace", namespace},
		{"config", "set-context", "--current", "--namespace=" + namespace},
	} {
		if _, err := k.run(ctx, args...); err != nil {
			return err
		}
	}
	clientset, err := kubernetes.NewForConfig(pl.Config)
	if err != nil {
		return err
	}
	if err := plane.WaitForServiceAccount(ctx, clientset, namespace); err != nil {
		return err
	}

	// The manager.
	return e.startManager(ctx, manager, managerKubeconfig)
}

func (e *env) printf(format string, args ...any) { fmt.Fprintf(e.out, format, args...) }

// rel is path relative to the repository root, when it is inside it.
func (e *env) rel(path string) string {
	if r, err := filepath.Rel(e.root, path); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return path
}

// kubectlEnv is the environment of kubectl: the demo's kubeconfig, and a
// discovery cache of its own rather than ~/.kube/cache.
func (e *env) kubectlEnv() []string {
	return append(cleanEnviron("KUBECONFIG", "KUBECACHEDIR"),
		"KUBECONFIG="+e.kubeconfig, "KUBECACHEDIR="+filepath.Join(e.dir, "kube-cache"))
}

// close stops everything, last started first.
func (e *env) close() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
	e.cleanups = nil
}

// findRoot walks up from the working directory to the directory whose
// go.mod declares this module.
func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && declaresModule(data) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of %s in the working directory or above it; run the demo inside the repository", modulePath)
		}
		dir = parent
	}
}

func declaresModule(gomod []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == modulePath {
			return true
		}
	}
	return false
}

// managerBinary returns the manager to run: the one given, or bin/manager,
// built first if it is missing or older than the sources it is built from.
func managerBinary(ctx context.Context, out io.Writer, root, given string) (string, error) {
	if given != "" {
		return filepath.Abs(given)
	}
	bin := filepath.Join(root, "bin", "manager")
	reason := ""
	if info, err := os.Stat(bin); err != nil {
		reason = "it is missing"
	} else if newer, err := newestSource(root); err != nil {
		return "", err
	} else if newer.After(info.ModTime()) {
		reason = "the sources changed since it was built"
	}
	if reason == "" {
		return bin, nil
	}
	fmt.Fprintf(out, "Building bin/manager, as %s:\n$ go build -o bin/manager ./cmd/manager\n", reason)
	// Build under another name and rename it into place, so a manager that
	// is running meanwhile (another demo's) is neither in the way nor hurt.
	tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
	cmd := exec.CommandContext(ctx, goTool(), "build", "-o", tmp, "./cmd/manager")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = childAttrs()
	if err := cmd.Run(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("go build -o bin/manager ./cmd/manager: %w", err)
	}
	if err := os.Rename(tmp, bin); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return bin, nil
}

// newestSource is the latest modification time of the manager's Go
// sources and of go.mod and go.sum.
func newestSource(root string) (time.Time, error) {
	var newest time.Time
	note := func(path string) {
		if info, err := os.Stat(path); err == nil && info.ModTime().After(newest) {
			newest = info.ModTime()
		}
	}
	note(filepath.Join(root, "go.mod"))
	note(filepath.Join(root, "go.sum"))
	for _, sub := range []string{"api", "cmd/manager", "controllers", "internal", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, sub), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil // a file removed meanwhile, or an unreadable one: not a source
			}
			if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
				note(path)
			}
			return nil
		})
		if err != nil {
			return newest, err
		}
	}
	return newest, nil
}

func goTool() string {
	if path, err := exec.LookPath("go"); err == nil {
		return path
	}
	if goroot := os.Getenv("GOROOT"); goroot != "" {
		return filepath.Join(goroot, "bin", "go")
	}
	return "/usr/local/go/bin/go"
}

// startManager runs the manager binary against the control plane and
// Redis, with its log in a file, and waits until it is ready.
func (e *env) startManager(ctx context.Context, bin, kubeconfig string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	probe := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := []string{
		"--kubeconfig", kubeconfig,
		"--shared-key", "nightly=*",
		"--metrics-bind-address", "0",
		"--health-probe-bind-address", probe,
	}
	e.managerLog = filepath.Join(e.dir, "manager.log")
	log, err := os.Create(e.managerLog)
	if err != nil {
		return err
	}
	defer log.Close() // the child has its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Dir = e.dir
	redisURL := "REDIS_URL=redis://" + e.redisAddr
	cmd.Env = append(cleanEnviron("KUBECONFIG", "REDIS_"), redisURL)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = childAttrs()
	fmt.Fprintf(e.out, "\nStarting the controller:\n$ %s %s %s\n", redisURL, e.rel(bin), shellJoin(args))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the manager: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	e.cleanups = append(e.cleanups, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	start := time.Now()
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-exited:
			return fmt.Errorf("the manager exited at start-up:\n%s", e.managerLogTail(40))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if resp, err := client.Get("http://" + probe + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				e.printf("manager        pid %d, ready in %.1fs (log: %s)\n", cmd.Process.Pid, time.Since(start).Seconds(), e.managerLog)
				return nil
			}
		}
		if time.Since(start) > 30*time.Second {
			return fmt.Errorf("the manager was not ready within 30s:\n%s", e.managerLogTail(40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// managerLogTail is the last n lines of the manager's log.
func (e *env) managerLogTail(n int) string {
	if e.managerLog == "" {
		return ""
	}
	data, err := os.ReadFile(e.managerLog)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// cleanEnviron is the process environment without the variables named, or
// starting with a name that ends in "_".
func cleanEnviron(drop ...string) []string {
	var env []string
next:
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		for _, d := range drop {
			if name == d || (strings.HasSuffix(d, "_") && strings.HasPrefix(name, d)) {
				continue next
			}
		}
		env = append(env, kv)
	}
	return env
}

// freePort is a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
