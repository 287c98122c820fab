// Package install checks what a user installs: the manager image that
// `make image` builds, unpacked and run as a container runtime would run it,
// and the manifests of `make install`, `make deploy` and `make
// build-installer`, applied to the local control plane (internal/plane),
// where the image's manager then runs as the installed Deployment's pod
// would, against a real redis-server.
package install

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/plane"
	"github.com/lockwarden/lockwarden/internal/redistest"
)

// The version and reference TestMain builds the image with.
const (
	testVersion = "v0.0.0-install-test"
	testImage   = "registry.example/lockwarden/manager:" + testVersion
)

// Shared by every test.
var (
	root      string // the repository
	pl        *plane.Plane
	clientset *kubernetes.Clientset
	k8s       client.Client
	redisSrv  *redistest.Server
	img       *image // unpacked from make image's OCI layout
	scratch   string // removed when the tests end
	imageTar  string // make image's docker-load tarball
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var err error
	if root, err = filepath.Abs(filepath.Join("..", "..")); err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp("", "lockwarden-install-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	scratch = dir

	// The image builds while the plane starts.
	ociDir := filepath.Join(dir, "oci")
	imageTar = filepath.Join(dir, "image.tar")
	built := make(chan error, 1)
	go func() {
		_, err := runMake(ctx, "image", "VERSION="+testVersion, "IMG="+testImage,
			"IMAGE_BIN="+filepath.Join(dir, "manager"), "IMAGE_OCI="+ociDir, "IMAGE_TAR="+imageTar)
		built <- err
	}()

	// No CRD: the tests install it as a user would.
	if pl, err = plane.Start(ctx, plane.Options{Progress: os.Stderr}); err != nil {
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
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return fail(err)
	}
	if k8s, err = client.New(pl.Config, client.Options{Scheme: scheme}); err != nil {
		return fail(err)
	}
	if redisSrv, err = redistest.StartServer(dir); err != nil {
		return fail(err)
	}
	defer redisSrv.Stop()

	if err := <-built; err != nil {
		return fail(err)
	}
	if img, err = unpackOCI(ociDir, filepath.Join(dir, "rootfs")); err != nil {
		return fail(fmt.Errorf("unpacking make image's OCI layout: %w", err))
	}
	return m.Run()
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "install test setup:", err)
	return 1
}

// runMake runs make in the repository.
func runMake(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "make", append([]string{"--no-print-directory", "-C", root}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("make %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// mustMake runs make with the plane's kubectl and kubeconfig, so install,
// deploy and their reverses act on the plane.
func mustMake(t *testing.T, args ...string) string {
	t.Helper()
	t.Setenv("KUBECONFIG", pl.Kubeconfig)
	out, err := runMake(t.Context(), append(args, "KUBECTL="+filepath.Join(pl.AssetsDir, "kubectl"))...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kubectl runs the plane's kubectl as its administrator.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(pl.AssetsDir, "kubectl"), append([]string{"--kubeconfig", pl.Kubeconfig}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// eventually polls cond every 100ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (last error: %v)", what, timeout, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
