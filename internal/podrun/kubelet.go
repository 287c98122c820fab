package podrun

import (
	"errors"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Kubelet runs pods' containers against one API server: Host, whose CA is
// CAData, read through Clientset.
type Kubelet struct {
	Clientset kubernetes.Interface
	Host      string
	CAData    []byte
}

// serviceAccountDir is where client-go's in-cluster configuration reads the
// token, the CA and the namespace.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// Start runs the named container of pod from a copy of img's files of its
// own: its command and args (extraArgs after them), its environment, its
// Secret and ConfigMap volumes, and its service account's token and the
// cluster's CA where client-go's in-cluster configuration reads them. The
// process is killed when the test ends if it still runs, and its output
// shown if the test failed.
func (k *Kubelet) Start(t testing.TB, img *Image, pod *corev1.Pod, name string, extraArgs ...string) *Process {
	t.Helper()
	ctx := t.Context()
	i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("pod %s has no container %s", pod.Name, name)
	}
	c := &pod.Spec.Containers[i]
	own := img.Copy(t)

	token, err := k.Clientset.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]file{
		serviceAccountDir + "/token":     {[]byte(token.Status.Token), 0o644},
		serviceAccountDir + "/ca.crt":    {k.CAData, 0o644},
		serviceAccountDir + "/namespace": {[]byte(pod.Namespace), 0o644},
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath == serviceAccountDir {
			continue // the service account's token, written above
		}
		if m.SubPath != "" || m.SubPathExpr != "" {
			t.Fatalf("the container mounts a subPath of %s, which podrun does not mount", m.Name)
		}
		for path, f := range k.volumeFiles(t, pod, m.Name) {
			files[filepath.Join(m.MountPath, path)] = f
		}
	}
	for path, f := range files {
		target := filepath.Join(own.Rootfs, path)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		// A file the image has is a hard link to the image's own: the
		// container's is a new file.
		if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		if err := os.WriteFile(target, f.data, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	apiserver, err := url.Parse(k.Host)
	if err != nil {
		t.Fatal(err)
	}
	env := append(k.env(t, pod, c), "KUBERNETES_SERVICE_HOST="+apiserver.Hostname(), "KUBERNETES_SERVICE_PORT="+apiserver.Port())

	p := &Process{exited: make(chan struct{}), Log: &SyncBuffer{}}
	p.cmd = own.Command(t, env, c.Command, slices.Concat(c.Args, extraArgs))
	p.cmd.Stdout, p.cmd.Stderr = p.Log, p.Log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s from the image: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.Kill()
		}
		if t.Failed() {
			t.Logf("%s's output:\n%s", name, p.Log.String())
		}
	})
	return p
}

// Process is a container's process that Start started.
type Process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	// Log is its output, stdout and stderr.
	Log *SyncBuffer
}

// Stop sends SIGTERM, as the kubelet stops a container, and waits for the
// process to exit within grace, returning its exit code.
func (p *Process) Stop(t testing.TB, grace time.Duration) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		select {
		case <-p.exited:
			return p.cmd.ProcessState.ExitCode()
		default:
			t.Fatal(err)
		}
	}
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.Kill()
		t.Fatalf("the process did not stop within %v", grace)
	}
	return p.cmd.ProcessState.ExitCode()
}

// Kill ends the process at once (SIGKILL), as a lost node or an OOM kill
// would.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Wait waits for the process to exit by itself within timeout and returns
// its exit code.
func (p *Process) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("the process did not exit within %v:\n%s", timeout, p.Log.String())
		return -1
	}
}
