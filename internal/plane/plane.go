// Package plane runs a local Kubernetes control plane on loopback for the
// demo and the end-to-end tests: etcd and kube-apiserver (hosted by envtest),
// kube-controller-manager (Jobs, CronJobs, ReplicaSets, the garbage
// collector, service-account tokens), kube-scheduler, and kwok playing the
// kubelet of fake nodes through the stages in stages.yaml.
//
// No container runs: a pod's phases and timings come from those stages,
// written after the kubelet's own rules (getPhase in
// k8s.io/kubernetes/pkg/kubelet/kubelet_pods.go). A pod scheduled on a fake
// node runs its init containers in order (plain ones complete, native
// sidecars run on) and then its app containers. Those exit as the pod's
// annotations plan (ExitCodesAnnotation, or a Job pod's single exit after
// CompleteDelayAnnotation, failing with FailAnnotation); the restart policy
// then restarts them in the same pod, after a CrashLoopBackOff wait, or the
// pod ends Succeeded or Failed. A pod deleted while it runs stops at its
// deletion timestamp (or StopDelayAnnotation after the deletion), so
// graceful deletion takes the grace period; sidecars stop after the app
// containers. Every start and stop of every container is stamped, to the
// nanosecond, in RunsAnnotation (see Runs).
package plane

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Annotations that steer the kwok stages, and the ones they write.
const (
	// CompleteDelayAnnotation is how long each run of the app containers
	// lasts before it exits as planned (ExitCodesAnnotation, or a Job pod's
	// single exit), as a Go duration such as "3s"; 1s by default.
	CompleteDelayAnnotation = "pod-complete.stage.kwok.x-k8s.io/delay"
	// FailAnnotation, set to "true" on a Job's pod with no
	// ExitCodesAnnotation, makes every run of it exit with code 1 instead of
	// one run exiting with 0.
	FailAnnotation = "plane.lockwarden.dev/fail"
	// ExitCodesAnnotation plans the exits of the app containers, such as
	// "1,0": run n (restartCount n) exits with the n-th code, each run
	// lasting CompleteDelayAnnotation. With no code left the containers run
	// until the pod is deleted. Whether an exit restarts them in the same
	// pod is the restart policy's call, as the kubelet's: Always restarts
	// every exit, OnFailure a non-zero one, Never none. All the app
	// containers of a pod exit and restart together.
	ExitCodesAnnotation = "plane.lockwarden.dev/exit-codes"
	// BackoffAnnotation is how long a container that the restart policy
	// restarts waits in CrashLoopBackOff before it runs again; 1s by
	// default. Its termination shows for half a second before.
	BackoffAnnotation = "plane.lockwarden.dev/backoff"
	// InitDelayAnnotation is how long each plain init container runs before
	// it completes (exit 0); 100ms by default.
	InitDelayAnnotation = "plane.lockwarden.dev/init-delay"
	// StopDelayAnnotation is how long the non-sidecar containers of a
	// deleted pod take to exit on SIGTERM (code 143), capped by the grace
	// period. Without it they ignore SIGTERM and are killed (137) at the
	// deletion timestamp, the end of the grace period.
	StopDelayAnnotation = "plane.lockwarden.dev/stop-delay"
	// SidecarStopDelayAnnotation is how long native sidecars run on once
	// the other containers have stopped for good (the pod ends, or is
	// deleted), capped by the grace period on deletion; 0 by default.
	SidecarStopDelayAnnotation = "plane.lockwarden.dev/sidecar-stop-delay"
	// RunsAnnotation is kwok's log of every start and stop of every
	// container of the pod (init containers, native sidecars, app
	// containers), one line each, appended in the same patch as the status
	// change it describes:
	//
	//	<RFC 3339 time with nanoseconds, UTC> start <container>
	//	<RFC 3339 time with nanoseconds, UTC> stop <container> <exit code>
	//
	// Read it with Runs.
	RunsAnnotation = "plane.lockwarden.dev/runs"
	// RunningAtAnnotation and StoppedAtAnnotation hold, in RFC 3339 with
	// nanoseconds, when the pod's first container started and when its
	// last one stopped once the pod ended. The status holds the same
	// instants to the second only. A pod whose containers restart ran
	// between the two with gaps: RunsAnnotation has each run.
	RunningAtAnnotation = "plane.lockwarden.dev/running-at"
	StoppedAtAnnotation = "plane.lockwarden.dev/stopped-at"
	// NextAtAnnotation is when, in RFC 3339 with nanoseconds, the running
	// app containers exit next, planned from CompleteDelayAnnotation when
	// they started: a later change of that delay does not move it. Write
	// this one to end the run at another time, as a container whose
	// process a test ran itself ends when that process exits.
	NextAtAnnotation = "plane.lockwarden.dev/next-at"
	// PartitionedAnnotation marks the pods of a node Partition cut off: no
	// stage acts on them.
	PartitionedAnnotation = "plane.lockwarden.dev/partitioned"
)

// NodeNames are the fake nodes. They carry no taint, so unmodified manifests
// schedule on them.
var NodeNames = []string{"kwok-node-0", "kwok-node-1"}

// kwokNodeAnnotation marks the nodes kwok manages.
const kwokNodeAnnotation = "kwok.x-k8s.io/node"

//go:embed stages.yaml
var stages []byte

// Options configure Start. The zero value works inside the repository.
type Options struct {
	// AssetsDir holds etcd, kube-apiserver, kubectl, kube-controller-manager,
	// kube-scheduler and kwok. Empty: $KUBEBUILDER_ASSETS if it holds them
	// all, or else what hack/setup-plane.sh prints (it builds them first).
	AssetsDir string
	// CRDDirectoryPaths are installed once the API server is up.
	CRDDirectoryPaths []string
	// Progress receives hack/setup-plane.sh's output when it builds; nil
	// discards it.
	Progress io.Writer
}

// Plane is a running control plane. Stop it with Stop.
type Plane struct {
	// Config is an administrator's (system:masters) client configuration.
	Config *rest.Config
	// Kubeconfig is the path of the same administrator's kubeconfig.
	Kubeconfig string
	// Dir is the plane's scratch directory: kubeconfigs, stages, and one
	// log file per process (etcd.log, kube-apiserver.log, ...).
	Dir string
	// AssetsDir is where the binaries came from; kubectl is in it.
	AssetsDir string
	// Env is the envtest environment that hosts etcd and kube-apiserver,
	// for AddUser.
	Env *envtest.Environment

	procs   []*process // started last, stopped first
	started []Process
}

// Process describes one process of the plane.
type Process struct {
	Name string
	PID  int
	// Startup is the time from its start to its health check passing. For
	// etcd and kube-apiserver it is read around envtest's start: etcd's
	// from the start to its readiness line in its log, kube-apiserver's
	// from then to envtest's return (CRDs installed), 0 if unknown.
	Startup time.Duration
}

// Start starts the plane and returns once both fake nodes are Ready and the
// default namespace has its default ServiceAccount, so pods can be created.
// On error it stops whatever it had started.
func Start(ctx context.Context, opts Options) (_ *Plane, err error) {
	p := &Plane{}
	defer func() {
		if err != nil {
			p.Stop()
		}
	}()
	if p.Dir, err = os.MkdirTemp("", "lockwarden-plane-"); err != nil {
		return nil, err
	}
	if p.AssetsDir, err = assetsDir(ctx, opts); err != nil {
		return nil, err
	}
	if err := p.startAPIServer(opts); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	apiserverCerts := p.Env.ControlPlane.APIServer.CertDir
	caFile := filepath.Join(p.Dir, "ca.crt")
	if err := os.WriteFile(caFile, p.Config.CAData, 0o600); err != nil {
		return nil, err
	}
	kcmKubeconfig, err := p.writeKubeconfig("kube-controller-manager", envtest.User{Name: "system:kube-controller-manager"})
	if err != nil {
		return nil, err
	}
	schedulerKubeconfig, err := p.writeKubeconfig("kube-scheduler", envtest.User{Name: "system:kube-scheduler"})
	if err != nil {
		return nil, err
	}
	// kwok patches node and pod status, node leases, deletes pods: the
	// published kwok manifests grant it that much too.
	kwokKubeconfig, err := p.writeKubeconfig("kwok", envtest.User{Name: "kwok", Groups: []string{"system:masters"}})
	if err != nil {
		return nil, err
	}
	stagesFile := filepath.Join(p.Dir, "stages.yaml")
	if err := os.WriteFile(stagesFile, stages, 0o600); err != nil {
		return nil, err
	}

	kcmPort, schedulerPort, kwokPort, err := freePorts3()
	if err != nil {
		return nil, err
	}
	// The three start together: none needs another to come up.
	for _, spec := range []processSpec{{
		name: "kube-controller-manager",
		args: []string{
			"--kubeconfig=" + kcmKubeconfig,
			// Each controller acts as its own service account, as in a
			// real cluster; as system:kube-controller-manager they could
			// create neither pods nor Jobs.
			"--use-service-account-credentials=true",
			// The key the API server verifies tokens with (envtest's),
			// and the CA put in every namespace's kube-root-ca.crt.
			"--service-account-private-key-file=" + filepath.Join(apiserverCerts, "sa-signer.key"),
			"--root-ca-file=" + caFile,
			// Nothing here sends certificate signing requests (there is
			// no kubelet), so the signer has no CA to sign with.
			"--controllers=*,-csrsigning",
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", kcmPort),
		},
		health: fmt.Sprintf("https://127.0.0.1:%d/healthz", kcmPort),
	}, {
		name: "kube-scheduler",
		args: []string{
			"--kubeconfig=" + schedulerKubeconfig,
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", schedulerPort),
		},
		health: fmt.Sprintf("https://127.0.0.1:%d/healthz", schedulerPort),
	}, {
		name: "kwok",
		args: []string{
			"--kubeconfig=" + kwokKubeconfig,
			"--config=" + stagesFile,
			// kwok reads no KwokConfiguration defaults from --config, so
			// every option it needs is a flag.
			"--manage-nodes-with-annotation-selector=" + kwokNodeAnnotation + "=fake",
			// Pod IPs, away from the service range given to the API server.
			"--cidr=10.244.0.0/16",
			"--node-ip=10.244.0.1",
			// Lease heartbeats, as a kubelet's; the controller manager
			// marks a node NotReady 50s after its lease stops.
			"--node-lease-duration-seconds=40",
			fmt.Sprintf("--server-address=127.0.0.1:%d", kwokPort),
		},
		health: fmt.Sprintf("http://127.0.0.1:%d/healthz", kwokPort),
	}} {
		proc, err := startProcess(filepath.Join(p.AssetsDir, spec.name), spec.args, filepath.Join(p.Dir, spec.name+".log"))
		if err != nil {
			return nil, err
		}
		proc.name, proc.health = spec.name, spec.health
		p.procs = append(p.procs, proc)
	}
	// Wait for the three at once, so each start-up time is its own.
	var children []*process
	for _, proc := range p.procs {
		if proc.cmd != nil { // not etcd and kube-apiserver: envtest waited for them
			children = append(children, proc)
		}
	}
	errs := make([]error, len(children))
	var wg sync.WaitGroup
	for i, proc := range children {
		wg.Go(func() { errs[i] = proc.waitHealthy(ctx, 60*time.Second) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, proc := range children {
		p.started = append(p.started, Process{Name: proc.name, PID: proc.cmd.Process.Pid, Startup: proc.startup})
	}

	clientset, err := kubernetes.NewForConfig(p.Config)
	if err != nil {
		return nil, err
	}
	if err := createNodes(ctx, clientset); err != nil {
		return nil, err
	}
	if err := waitNodesReady(ctx, clientset, NodeNames...); err != nil {
		return nil, err
	}
	if err := WaitForServiceAccount(ctx, clientset, metav1.NamespaceDefault); err != nil {
		return nil, err
	}
	return p, nil
}

type processSpec struct {
	name   string
	args   []string
	health string
}

// startAPIServer starts etcd and kube-apiserver with envtest, configured as
// the rest of the plane needs them.
func (p *Plane) startAPIServer(opts Options) error {
	p.Env = &envtest.Environment{
		CRDDirectoryPaths:     opts.CRDDirectoryPaths,
		ErrorIfCRDPathMissing: len(opts.CRDDirectoryPaths) > 0,
		BinaryAssetsDirectory: p.AssetsDir,
	}
	etcdLog, err := newStampedLog(filepath.Join(p.Dir, "etcd.log"), "ready to serve client requests")
	if err != nil {
		return err
	}
	apiserverLog, err := newStampedLog(filepath.Join(p.Dir, "kube-apiserver.log"), "")
	if err != nil {
		etcdLog.Close()
		return err
	}
	p.procs = append(p.procs, &process{closer: etcdLog}, &process{closer: apiserverLog})
	etcdPath, err := p.wrapDeathSignal("etcd")
	if err != nil {
		return err
	}
	apiserverPath, err := p.wrapDeathSignal("kube-apiserver")
	if err != nil {
		return err
	}
	p.Env.ControlPlane.Etcd = &envtest.Etcd{Path: etcdPath, Out: etcdLog, Err: etcdLog}
	p.Env.ControlPlane.APIServer = &envtest.APIServer{Path: apiserverPath, Out: apiserverLog, Err: apiserverLog}
	args := p.Env.ControlPlane.APIServer.Configure()
	// envtest's default service range, 10.0.0.0/24, is kwok's default pod
	// CIDR's neighbour; keep services well apart from pod IPs.
	args.Set("service-cluster-ip-range", "10.96.0.0/16")
	// envtest disables the ServiceAccount admission plugin, as nothing
	// makes default ServiceAccounts there. Here the controller manager does,
	// and pods get their token volume as in a real cluster.
	args.Disable("disable-admission-plugins")
	// The address published in the kubernetes Service's endpoints. Nothing
	// connects to it, but a loopback one makes the API server complain every
	// 10s; 192.0.2.1 is TEST-NET-1, never routed.
	args.Set("advertise-address", "192.0.2.1")

	start := time.Now()
	if _, err := p.Env.Start(); err != nil {
		_ = p.Env.Stop() // whatever half started
		return fmt.Errorf("start etcd and kube-apiserver: %w", err)
	}
	ready := time.Since(start)
	etcdReady := etcdLog.stampTime().Sub(start)
	if etcdLog.stampTime().IsZero() {
		etcdReady = 0 // its log format changed; the combined figure still holds
	}
	p.started = append(p.started,
		Process{Name: "etcd", PID: childPID("etcd"), Startup: etcdReady},
		Process{Name: "kube-apiserver", PID: childPID("kube-apiserver"), Startup: ready - etcdReady},
	)
	p.procs = append(p.procs, &process{stop: func() error { return p.Env.Stop() }})

	admin, err := p.Env.AddUser(envtest.User{Name: "plane-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	p.Config = admin.Config()
	data, err := admin.KubeConfig()
	if err != nil {
		return err
	}
	p.Kubeconfig = filepath.Join(p.Dir, "admin.kubeconfig")
	return os.WriteFile(p.Kubeconfig, data, 0o600)
}

// writeKubeconfig mints a client certificate for user and writes its
// kubeconfig as <name>.kubeconfig.
func (p *Plane) writeKubeconfig(name string, user envtest.User) (string, error) {
	u, err := p.Env.AddUser(user, nil)
	if err != nil {
		return "", err
	}
	data, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(p.Dir, name+".kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

// Processes lists the plane's processes in the order they started, with
// their start-up times.
func (p *Plane) Processes() []Process { return append([]Process(nil), p.started...) }

// Stop stops every process, last started first, and removes Dir. It may be
// called more than once.
func (p *Plane) Stop() {
	for i := len(p.procs) - 1; i >= 0; i-- {
		p.procs[i].stopAndClose()
	}
	p.procs = nil
	if p.Dir != "" {
		_ = os.RemoveAll(p.Dir)
		p.Dir = ""
	}
}

// assetsDir finds the binaries: Options.AssetsDir, $KUBEBUILDER_ASSETS if it
// has them all (make test points it at the same directory), or
// hack/setup-plane.sh's answer.
func assetsDir(ctx context.Context, opts Options) (string, error) {
	if opts.AssetsDir != "" {
		return opts.AssetsDir, nil
	}
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" && hasBinaries(dir) {
		return dir, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "setup-plane.sh"))
	cmd.Dir = root
	cmd.Stderr = opts.Progress
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/setup-plane.sh: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

var binaries = []string{"etcd", "kube-apiserver", "kubectl", "kube-controller-manager", "kube-scheduler", "kwok"}

func hasBinaries(dir string) bool {
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return false
		}
	}
	return true
}

// repoRoot walks up from the working directory (a test's is its package
// directory) to the directory with hack/setup-plane.sh.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "setup-plane.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no hack/setup-plane.sh in the working directory or above it; set KUBEBUILDER_ASSETS or Options.AssetsDir")
		}
		dir = parent
	}
}

// createNodes creates the fake nodes, annotated for kwok to manage.
func createNodes(ctx context.Context, clientset kubernetes.Interface) error {
	for _, name := range NodeNames {
		if _, err := clientset.CoreV1().Nodes().Create(ctx, fakeNode(name), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create node %s: %w", name, err)
		}
	}
	return nil
}

// fakeNode is a Node object that kwok manages.
func fakeNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        name,
		Annotations: map[string]string{kwokNodeAnnotation: "fake"},
		Labels: map[string]string{
			"kubernetes.io/hostname": name,
			"kubernetes.io/os":       "linux",
			"kubernetes.io/arch":     "amd64",
			"type":                   "kwok",
		},
	}}
}

func waitNodesReady(ctx context.Context, clientset kubernetes.Interface, names ...string) error {
	return poll(ctx, 60*time.Second, "fake nodes Ready", func() (bool, error) {
		for _, name := range names {
			node, err := clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			ready := false
			for _, c := range node.Status.Conditions {
				ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
			}
			if !ready {
				return false, nil
			}
		}
		return true, nil
	})
}

// WaitForServiceAccount waits for namespace's default ServiceAccount, which
// the controller manager creates from milliseconds to about a second after
// the namespace: until then, pods in it are refused.
func WaitForServiceAccount(ctx context.Context, clientset kubernetes.Interface, namespace string) error {
	return poll(ctx, 30*time.Second, "the default ServiceAccount in "+namespace, func() (bool, error) {
		_, err := clientset.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
}

// poll calls cond every 50ms until it is true, it fails, ctx ends or
// timeout passes.
func poll(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("waiting for %s: %w", what, err)
			}
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freePorts3 returns three loopback ports that were free a moment ago,
// distinct from one another.
func freePorts3() (a, b, c int, err error) {
	var ports [3]int
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, 0, err
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports[0], ports[1], ports[2], nil
}

// healthy reports whether url answers 200.
func healthy(client *http.Client, url string) bool {
	resp, err := client.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// stampedLog is a log file that also notes when a line containing marker
// was first written: etcd's readiness, inside envtest's start-up.
type stampedLog struct {
	// Not embedded: os/exec copies with io.Copy, which would use an
	// embedded *os.File's ReadFrom and never call Write.
	file   *os.File
	marker []byte
	stamp  atomic.Int64 // UnixNano; 0 until the marker is seen
}

func newStampedLog(path, marker string) (*stampedLog, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &stampedLog{file: f, marker: []byte(marker)}, nil
}

func (l *stampedLog) Write(b []byte) (int, error) {
	if len(l.marker) > 0 && l.stamp.Load() == 0 && bytes.Contains(b, l.marker) {
		l.stamp.Store(time.Now().UnixNano())
	}
	return l.file.Write(b)
}

func (l *stampedLog) Close() error { return l.file.Close() }

// stampTime is when the marker was first written; zero if never.
func (l *stampedLog) stampTime() time.Time {
	if n := l.stamp.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}
