package release

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/plane"
)

// What every test shares: the registry the release is published to and
// installed from, the signing keys, the local control plane (started in
// the background by the install test, while the release builds), and the
// two builds of the release.
var (
	root    string // the repository
	scratch string // removed when the tests end
	reg     *registry
	keys    struct{ private, public, other string }
	// changelog is a CHANGELOG.md with a section for the test's version,
	// which `make publish` requires for the release notes.
	changelog string
	// downloads serves the release's files as the GitHub release would,
	// from the registry's release artifact: the krew manifest's URLs point
	// there.
	downloads *downloadServer
	planeOnce sync.Once
	planeUp   = make(chan struct{})
	pl        *plane.Plane
	planeErr  error
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var err error
	if root, err = filepath.Abs(filepath.Join("..", "..")); err != nil {
		return fail(err)
	}
	if scratch, err = os.MkdirTemp("", "lockwarden-release-"); err != nil {
		return fail(err)
	}
	defer os.RemoveAll(scratch)

	planeCtx = ctx
	defer func() {
		planeOnce.Do(func() { close(planeUp) }) // none was started
		<-planeUp
		if pl != nil {
			pl.Stop()
		}
	}()

	if reg, err = startRegistry(ctx); err != nil {
		return fail(err)
	}
	defer reg.stop()
	if err := makeKeys(ctx); err != nil {
		return fail(err)
	}
	changelog = filepath.Join(scratch, "CHANGELOG.md")
	if err := os.WriteFile(changelog, []byte(releaseNotes+"\n## v0.0.0-older\n\nNot this one.\n"), 0o644); err != nil {
		return fail(err)
	}
	if downloads, err = startDownloads(); err != nil {
		return fail(err)
	}
	defer downloads.Close()
	return m.Run()
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "release test setup:", err)
	return 1
}

// releaseNotes is the test CHANGELOG's section for the version.
const releaseNotes = "## " + version + "\n\n- What this release changed.\n"

// registry is go-containerregistry's registry, served by
// hack/tools/release/registry on a loopback port over TLS.
type registry struct {
	host   string // 127.0.0.1:PORT
	caFile string // its certificate, PEM
	client *http.Client
	cmd    *exec.Cmd
	stdin  io.WriteCloser // the registry serves until it closes
}

func startRegistry(ctx context.Context) (*registry, error) {
	bin := filepath.Join(scratch, "registry")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./registry")
	build.Dir = filepath.Join(root, "hack", "tools", "release")
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the registry: %v\n%s", err, out)
	}
	r := &registry{caFile: filepath.Join(scratch, "registry-ca.pem")}
	blobs := filepath.Join(scratch, "registry-blobs")
	r.cmd = exec.Command(bin, "-dir", blobs, "-ca-file", r.caFile)
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r.cmd.Stderr = os.Stderr
	var err error
	if r.stdin, err = r.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = r.cmd.Process.Kill()
		return nil, fmt.Errorf("the registry printed no address: %w", err)
	}
	r.host = strings.TrimSpace(line)
	ca, err := os.ReadFile(r.caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s holds no certificate", r.caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig.RootCAs = pool
	r.client = &http.Client{Transport: tr, Timeout: time.Minute}
	return r, nil
}

func (r *registry) stop() {
	_ = r.stdin.Close()
	_ = r.cmd.Wait()
}

// makeKeys makes the cosign key pair the release is signed with, and a
// second one it is not.
func makeKeys(ctx context.Context) error {
	for _, k := range []struct {
		prefix          string
		private, public *string
	}{{"cosign", &keys.private, &keys.public}, {"other", nil, &keys.other}} {
		cmd := exec.CommandContext(ctx, cosignBin(), "generate-key-pair", "--output-key-prefix", filepath.Join(scratch, k.prefix))
		cmd.Env = append(os.Environ(), "COSIGN_PASSWORD="+keyPassword)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("cosign generate-key-pair: %v\n%s", err, out)
		}
		if k.private != nil {
			*k.private = filepath.Join(scratch, k.prefix+".key")
		}
		*k.public = filepath.Join(scratch, k.prefix+".pub")
	}
	return nil
}

// keyPassword encrypts the test's private keys, as `make publish` expects
// a maintainer's to be.
const keyPassword = "release-test-password"

func cosignBin() string { return filepath.Join(root, "bin", "cosign") }

// toolEnv is the environment of make and of the tools the tests run: the
// registry's certificate trusted (SSL_CERT_FILE, which Go programs read),
// the key's password, and docker's and helm's configuration of the test's
// own (no credentials: the registry asks for none).
func toolEnv() []string {
	home := filepath.Join(scratch, "home")
	return append(os.Environ(), "SSL_CERT_FILE="+reg.caFile, "COSIGN_PASSWORD="+keyPassword,
		"DOCKER_CONFIG="+filepath.Join(home, "docker"), "HELM_CACHE_HOME="+filepath.Join(home, "helm-cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "helm-config"), "HELM_DATA_HOME="+filepath.Join(home, "helm-data"))
}

// The two builds of the release, each made once: `make release` and `make
// publish`, for the same registry, from the same commit.
var (
	releasedOnce, publishedOnce sync.Once
	released, published         build
)

type build struct {
	dir, out string
	err      error
}

func releasedBuild(t *testing.T) string {
	t.Helper()
	releasedOnce.Do(func() {
		released.dir = filepath.Join(scratch, "released")
		released.out, released.err = runMake("release", "VERSION="+version, "RELEASE_DIR="+released.dir)
	})
	if released.err != nil {
		t.Fatalf("make release: %v\n%s", released.err, released.out)
	}
	return released.dir
}

func publishedBuild(t *testing.T) string {
	t.Helper()
	publishedOnce.Do(func() {
		published.dir = filepath.Join(scratch, "published")
		start := time.Now()
		published.out, published.err = runMake("publish", "VERSION="+version, "RELEASE_DIR="+published.dir, "COSIGN_KEY="+keys.private)
		t.Logf("make publish took %v", time.Since(start).Round(time.Second))
	})
	if published.err != nil {
		t.Fatalf("make publish: %v\n%s", published.err, published.out)
	}
	return published.dir
}

// runMake runs make in the repository for the test's registry, release URL
// and CHANGELOG, on the work tree as it is.
func runMake(args ...string) (string, error) {
	cmd := exec.Command("make", append([]string{"--no-print-directory", "-C", root,
		"REGISTRY=" + reg.host + "/lockwarden", "RELEASE_URL=" + downloads.base, "CHANGELOG=" + changelog, "RELEASE_ALLOW_DIRTY=1"}, args...)...)
	cmd.Env = toolEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// planeCtx bounds the control plane's start.
var planeCtx context.Context

// startPlane starts the local control plane in the background, once.
func startPlane() {
	planeOnce.Do(func() {
		go func() {
			defer close(planeUp)
			pl, planeErr = plane.Start(planeCtx, plane.Options{})
		}()
	})
}

// waitPlane starts the control plane unless it was, and waits for it.
func waitPlane(t *testing.T) *plane.Plane {
	startPlane()
	t.Helper()
	<-planeUp
	if planeErr != nil {
		t.Fatalf("the local control plane: %v", planeErr)
	}
	return pl
}
