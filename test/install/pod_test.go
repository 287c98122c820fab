package install

import (
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
)

// podProcess is a container of an installed pod that the test runs from
// make image's image, as the kubelet would run it: kwok only pretends to.
type podProcess struct {
	cmd    *exec.Cmd
	exited chan struct{}
	log    *syncBuffer
}

// startContainer runs the named container of a pod spec of namespace ns:
// its command and args (with extraArgs after them), its environment from
// the Secrets and ConfigMaps it names, its Secret volumes, and the API
// server reached through its ServiceAccount's token, chrooted into a copy
// of the image's files of its own. The process is killed at the end of the
// test if it still runs, and its output shown if the test failed.
func startContainer(t *testing.T, ns string, spec corev1.PodSpec, name string, extraArgs ...string) *podProcess {
	t.Helper()
	ctx := t.Context()
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("the pod has no container %s", name)
	}
	container := &spec.Containers[i]
	own := img.copy(t)

	// What the kubelet would give the container: its service account's
	// token and the cluster CA where client-go's in-cluster configuration
	// looks, its volumes and its environment.
	token, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, spec.ServiceAccountName, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"/var/run/secrets/kubernetes.io/serviceaccount/token":     []byte(token.Status.Token),
		"/var/run/secrets/kubernetes.io/serviceaccount/ca.crt":    pl.Config.CAData,
		"/var/run/secrets/kubernetes.io/serviceaccount/namespace": []byte(ns),
	}
	for _, m := range container.VolumeMounts {
		if m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount" {
			continue // the ServiceAccount's token, written above
		}
		for name, data := range volumeFiles(t, ns, spec.Volumes, m.Name) {
			files[filepath.Join(m.MountPath, name)] = data
		}
	}
	for name, data := range files {
		target := filepath.Join(own.rootfs, name)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(target, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	apiserver, err := url.Parse(pl.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	env := append(containerEnv(t, ns, container),
		"KUBERNETES_SERVICE_HOST="+apiserver.Hostname(), "KUBERNETES_SERVICE_PORT="+apiserver.Port())

	p := &podProcess{exited: make(chan struct{}), log: &syncBuffer{}}
	p.cmd = own.command(t, env, container.Command, append(slices.Clone(container.Args), extraArgs...))
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s from the image: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s's output:\n%s", name, p.log.String())
		}
	})
	return p
}

// stop sends SIGTERM, as the kubelet stops a container, and waits for the
// process to exit within grace, returning its exit code.
func (p *podProcess) stop(t *testing.T, grace time.Duration) int {
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
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Fatalf("the process did not stop within %v", grace)
	}
	return p.cmd.ProcessState.ExitCode()
}

// kill ends the process at once (SIGKILL), as a lost node or an OOM kill
// would.
func (p *podProcess) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// wait waits for the process to exit by itself and returns its exit code.
func (p *podProcess) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("the process did not exit within %v:\n%s", timeout, p.log.String())
		return -1
	}
}

// copy returns the image with a copy of its files of its own, so that the
// files written for one container (its token, its Secrets) are not
// another's: directories copied, files hard-linked, the new files its own.
func (img *image) copy(t *testing.T) *image {
	t.Helper()
	dir := t.TempDir()
	c := *img
	c.rootfs = filepath.Join(dir, "rootfs")
	if out, err := exec.Command("cp", "-al", img.rootfs, c.rootfs).CombinedOutput(); err != nil {
		if out, err := exec.Command("cp", "-a", img.rootfs, c.rootfs).CombinedOutput(); err != nil {
			t.Fatalf("copying the image's files: %v\n%s", err, out)
		}
		_ = out
	}
	// The copy must be the image's user's to write into, as the original.
	if err := os.Chmod(c.rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	return &c
}
