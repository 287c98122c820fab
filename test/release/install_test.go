package release

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lockwarden/lockwarden/internal/podrun"
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
	if out, code := img.Output(t, 30*time.Second, []string{"/manager"}, []string{"--version"}); code != 0 || strings.TrimSpace(out) != version {
		t.Errorf("the pulled image's manager --version: %q (exit code %d), want %s", out, code, version)
	}
	probes := freeAddr(t)
	kubelet := &podrun.Kubelet{Clientset: clientset, Host: pl.Config.Host, CAData: pl.Config.CAData}
	m := kubelet.Start(t, img, &pod, "manager", "--health-probe-bind-address="+probes, "--metrics-bind-address=0")
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
	if log := m.Log.String(); !strings.Contains(log, `"version":"`+version+`"`) {
		t.Errorf("the manager did not log its version %s:\n%s", version, log)
	}
}

// pullImage pulls the image of arch from the index repo@digest and
// unpacks its layers, checking each against the config's diff_ids.
func pullImage(t *testing.T, repo, digest, arch string) *podrun.Image {
	t.Helper()
	idx, _ := reg.manifest(t, repo, digest)
	i := slices.IndexFunc(idx.Manifests, func(d ociDescriptor) bool {
		return d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == arch
	})
	if i < 0 {
		t.Fatalf("%s@%s has no linux/%s image", repo, digest, arch)
	}
	m, _ := reg.manifest(t, repo, idx.Manifests[i].Digest)
	var config struct {
		Architecture string             `json:"architecture"`
		Config       podrun.ImageConfig `json:"config"`
		RootFS       struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(reg.blob(t, repo, m.Config.Digest), &config); err != nil {
		t.Fatal(err)
	}
	if config.Architecture != arch {
		t.Fatalf("the linux/%s image's config says %s", arch, config.Architecture)
	}
	if len(m.Layers) != len(config.RootFS.DiffIDs) {
		t.Fatalf("%d layers but %d diff_ids", len(m.Layers), len(config.RootFS.DiffIDs))
	}
	img := &podrun.Image{Rootfs: filepath.Join(t.TempDir(), "rootfs"), Config: config.Config}
	for i, l := range m.Layers {
		if _, err := podrun.UnpackLayer(reg.blob(t, repo, l.Digest), config.RootFS.DiffIDs[i], img.Rootfs); err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
	}
	return img
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
