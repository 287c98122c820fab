package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lockwarden/lockwarden/internal/redistest"
)

// TestInstallFromRegistry installs the published chart from oci:// onto
// the local control plane, as a user would with nothing but the registry:
// the Deployment runs the manager image by the digest of the index in the
// registry. kwok's nodes pull and run nothing, so the test pulls that
// image from the registry by digest itself, for this machine's
// architecture, and runs its /manager as the kubelet would run the
// Deployment's pod (its arguments, environment, Secret and ConfigMap
// volumes and service account token, chrooted into the image's files), and
// waits until it is ready by the Deployment's probe and leads.
func TestInstallFromRegistry(t *testing.T) {
	startPlane()
	publishedBuild(t)
	pl := waitPlane(t)
	ctx := t.Context()
	clientset, err := kubernetes.NewForConfig(pl.Config)
	if err != nil {
		t.Fatal(err)
	}
	redisSrv, err := redistest.StartServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(redisSrv.Stop)

	const ns = "lockwarden-system"
	if _, err := clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := clientset.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "lockwarden-redis"},
		StringData: map[string]string{"url": "redis://" + redisSrv.Addr + "/0", "password": ""},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	chart := "oci://" + reg.host + "/lockwarden/charts/lockwarden"
	helm := exec.CommandContext(ctx, filepath.Join(root, "bin", "helm"), "install", "lockwarden", chart, "--version", strings.TrimPrefix(version, "v"),
		"-n", ns, "--wait", "--timeout", "2m")
	helm.Env = append(toolEnv(), "KUBECONFIG="+pl.Kubeconfig)
	if out, err := helm.CombinedOutput(); err != nil {
		t.Fatalf("helm install %s: %v\n%s", chart, err, out)
	}

	// The Deployment runs the image by the digest the registry gives the
	// release's tag.
	_, digest := reg.manifest(t, managerRepo, version)
	deploy, err := clientset.AppsV1().Deployments(ns).Get(ctx, "lockwarden-controller-manager", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(deploy.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == "manager" })
	if i < 0 {
		t.Fatal("the Deployment has no manager container")
	}
	if want := reg.host + "/" + managerRepo + ":" + version + "@" + digest; deploy.Spec.Template.Spec.Containers[i].Image != want {
		t.Fatalf("the installed manager image is %s, want %s", deploy.Spec.Template.Spec.Containers[i].Image, want)
	}
	pods, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(deploy.Spec.Selector)})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the manager's pods: %v (%v)", pods, err)
	}
	pod := pods.Items[0]

	// The image, pulled by that digest, for this machine.
	img := pullImage(t, managerRepo, digest, runtime.GOARCH)
	if out, err := img.command(nil, []string{"/manager"}, []string{"--version"}).Output(); err != nil || strings.TrimSpace(string(out)) != version {
		t.Errorf("the pulled image's manager --version: %q (%v), want %s", out, err, version)
	}
	probes := freeAddr(t)
	m := runPod(t, clientset, pl.Config.Host, pl.Config.CAData, &pod, img, "manager", "--health-probe-bind-address="+probes, "--metrics-bind-address=0")
	eventually(t, 60*time.Second, "the manager's /readyz", func() error {
		resp, err := http.Get("http://" + probes + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
	eventually(t, 60*time.Second, "the manager to lead", func() error {
		lease, err := clientset.CoordinationV1().Leases(ns).Get(ctx, "lockwarden-manager.lockwarden.dev", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return fmt.Errorf("no holder: %+v", lease.Spec)
		}
		return nil
	})
	if log := m.String(); !strings.Contains(log, `"version":"`+version+`"`) {
		t.Errorf("the manager did not log its version %s:\n%s", version, log)
	}
}

// image is an image pulled from the registry: its config and its files
// unpacked in rootfs.
type image struct {
	rootfs string
	config struct {
		Architecture string
		Config       struct {
			Entrypoint, Env []string
			User            string
			WorkingDir      string
		}
	}
}

// pullImage pulls the image of arch from the index repo@digest and
// unpacks its layers.
func pullImage(t *testing.T, repo, digest, arch string) *image {
	t.Helper()
	idx, _ := reg.manifest(t, repo, digest)
	i := slices.IndexFunc(idx.Manifests, func(d ociDescriptor) bool {
		return d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == arch
	})
	if i < 0 {
		t.Fatalf("%s@%s has no linux/%s image", repo, digest, arch)
	}
	m, _ := reg.manifest(t, repo, idx.Manifests[i].Digest)
	img := &image{rootfs: filepath.Join(t.TempDir(), "rootfs")}
	if err := json.Unmarshal(reg.blob(t, repo, m.Config.Digest), &img.config); err != nil {
		t.Fatal(err)
	}
	if img.config.Architecture != arch {
		t.Fatalf("the linux/%s image's config says %s", arch, img.config.Architecture)
	}
	for _, l := range m.Layers {
		if err := unpack(reg.blob(t, repo, l.Digest), img.rootfs); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

// unpack writes a gzipped layer's directories and regular files under dir.
func unpack(layer []byte, dir string) error {
	zr, err := gzip.NewReader(bytes.NewReader(layer))
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		target := filepath.Join(dir, filepath.Clean("/"+hdr.Name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, os.FileMode(hdr.Mode).Perm()|0o700)
		case tar.TypeReg:
			if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
				var data []byte
				if data, err = io.ReadAll(tr); err == nil {
					err = os.WriteFile(target, data, os.FileMode(hdr.Mode).Perm())
				}
			}
		default:
			err = fmt.Errorf("the layer's %s is of tar type %c, which this test does not unpack", hdr.Name, hdr.Typeflag)
		}
		if err != nil {
			return err
		}
	}
}

// command is the image's process as a container runtime starts it:
// Kubernetes' command replacing the entrypoint, args after it, the image's
// environment then env, as the image's user (in a user namespace of its
// own, mapped to this process's), chrooted into its files.
func (img *image) command(env, command, args []string) *exec.Cmd {
	argv := img.config.Config.Entrypoint
	if len(command) > 0 {
		argv = command
	}
	argv = slices.Concat(argv, args)
	user, group, _ := strings.Cut(img.config.Config.User, ":")
	uid, _ := strconv.Atoi(user)
	gid, _ := strconv.Atoi(group)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = img.config.Config.WorkingDir
	cmd.Env = slices.Concat(img.config.Config.Env, env)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:      img.rootfs,
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: os.Geteuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: gid, HostID: os.Getegid(), Size: 1}},
		Setpgid:     true,
		Pdeathsig:   syscall.SIGKILL,
	}
	return cmd
}

// runPod runs the named container of pod from img as the kubelet would:
// its command and args (extraArgs after them), its environment (values,
// Secret and ConfigMap keys, the pod's own fields), its Secret and
// ConfigMap volumes, and its service account's token and the cluster's CA
// where client-go's in-cluster configuration reads them, with the API
// server at host. It returns the process's output; the process is killed
// when the test ends, and its output shown if the test failed.
func runPod(t *testing.T, clientset *kubernetes.Clientset, host string, caData []byte, pod *corev1.Pod, img *image, name string, extraArgs ...string) *syncBuffer {
	t.Helper()
	ctx := t.Context()
	i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("pod %s has no container %s", pod.Name, name)
	}
	c := pod.Spec.Containers[i]
	token, err := clientset.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"/var/run/secrets/kubernetes.io/serviceaccount/token":     []byte(token.Status.Token),
		"/var/run/secrets/kubernetes.io/serviceaccount/ca.crt":    caData,
		"/var/run/secrets/kubernetes.io/serviceaccount/namespace": []byte(pod.Namespace),
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount" {
			continue // the service account's token, written above
		}
		v := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if v < 0 {
			t.Fatalf("the container mounts %s, which the pod does not have", m.Name)
		}
		for file, data := range volumeFiles(t, clientset, pod.Namespace, pod.Spec.Volumes[v]) {
			files[filepath.Join(m.MountPath, file)] = data
		}
	}
	for path, data := range files {
		target := filepath.Join(img.rootfs, path)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(target, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	u, err := url.Parse(host)
	if err != nil {
		t.Fatal(err)
	}
	env := append(containerEnv(t, clientset, pod, c), "KUBERNETES_SERVICE_HOST="+u.Hostname(), "KUBERNETES_SERVICE_PORT="+u.Port())
	cmd := img.command(env, c.Command, slices.Concat(c.Args, extraArgs))
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s from the image: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("%s's output:\n%s", name, out.String())
		}
	})
	return out
}

// volumeFiles returns the files a Secret or ConfigMap volume holds, by
// path in the volume.
func volumeFiles(t *testing.T, clientset *kubernetes.Clientset, ns string, v corev1.Volume) map[string][]byte {
	t.Helper()
	ctx := t.Context()
	var data map[string][]byte
	var items []corev1.KeyToPath
	switch {
	case v.Secret != nil:
		s, err := clientset.CoreV1().Secrets(ns).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		data, items = s.Data, v.Secret.Items
	case v.ConfigMap != nil:
		cm, err := clientset.CoreV1().ConfigMaps(ns).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		data, items = map[string][]byte{}, v.ConfigMap.Items
		for k, s := range cm.Data {
			data[k] = []byte(s)
		}
	default:
		t.Fatalf("volume %s is neither a Secret nor a ConfigMap, which this test does not mount", v.Name)
	}
	if len(items) == 0 {
		return data
	}
	files := map[string][]byte{}
	for _, it := range items {
		files[it.Path] = data[it.Key]
	}
	return files
}

// containerEnv is a container's environment as the kubelet sets it.
func containerEnv(t *testing.T, clientset *kubernetes.Clientset, pod *corev1.Pod, c corev1.Container) []string {
	t.Helper()
	ctx := t.Context()
	var env []string
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := clientset.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range cm.Data {
				env = append(env, from.Prefix+k+"="+v)
			}
		case from.SecretRef != nil:
			s, err := clientset.CoreV1().Secrets(pod.Namespace).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range s.Data {
				env = append(env, from.Prefix+k+"="+string(v))
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s, err := clientset.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			v, ok := s.Data[ref.Key]
			if !ok && (ref.Optional == nil || !*ref.Optional) {
				t.Fatalf("%s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
			}
			if ok {
				env = append(env, e.Name+"="+string(v))
			}
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.namespace":
				env = append(env, e.Name+"="+pod.Namespace)
			case "metadata.name":
				env = append(env, e.Name+"="+pod.Name)
			case "spec.serviceAccountName":
				env = append(env, e.Name+"="+pod.Spec.ServiceAccountName)
			default:
				t.Fatalf("%s: field %s, which this test does not fill", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		default:
			t.Fatalf("%s: a value source this test does not fill: %+v", e.Name, e.ValueFrom)
		}
	}
	return env
}

// freeAddr is a free loopback address.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// eventually polls cond every 200 ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// syncBuffer is a process's output, written and read concurrently.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
