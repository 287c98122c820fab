package install

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// image is an image unpacked from an OCI layout by unpackOCI, which reads it
// with the standard library only, as a container runtime would: it checks
// every digest, so it does not trust the builder's own library.
type image struct {
	refName      string // the index's org.opencontainers.image.ref.name
	configDigest string
	config       struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Config       struct {
			Entrypoint []string          `json:"Entrypoint"`
			Cmd        []string          `json:"Cmd"`
			Env        []string          `json:"Env"`
			User       string            `json:"User"`
			WorkingDir string            `json:"WorkingDir"`
			Labels     map[string]string `json:"Labels"`
		} `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	rootfs  string
	headers map[string]*tar.Header // by path in the image, e.g. "/manager"
}

func unpackOCI(dir, rootfs string) (*image, error) {
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := readJSON(filepath.Join(dir, "index.json"), &index); err != nil {
		return nil, err
	}
	if len(index.Manifests) != 1 {
		return nil, fmt.Errorf("index.json lists %d manifests, want 1", len(index.Manifests))
	}
	img := &image{refName: index.Manifests[0].Annotations["org.opencontainers.image.ref.name"], rootfs: rootfs, headers: map[string]*tar.Header{}}
	var manifest struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
		Layers []struct {
			MediaType string `json:"mediaType"`
			Digest    string `json:"digest"`
		} `json:"layers"`
	}
	if err := readBlobJSON(dir, index.Manifests[0].Digest, &manifest); err != nil {
		return nil, err
	}
	img.configDigest = manifest.Config.Digest
	if err := readBlobJSON(dir, manifest.Config.Digest, &img.config); err != nil {
		return nil, err
	}
	if len(manifest.Layers) != len(img.config.RootFS.DiffIDs) {
		return nil, fmt.Errorf("%d layers but %d diff_ids", len(manifest.Layers), len(img.config.RootFS.DiffIDs))
	}
	for i, layer := range manifest.Layers {
		if layer.MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
			return nil, fmt.Errorf("layer %d has media type %s", i, layer.MediaType)
		}
		blob, err := readBlob(dir, layer.Digest)
		if err != nil {
			return nil, err
		}
		if err := img.extract(blob, img.config.RootFS.DiffIDs[i]); err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return img, nil
}

func readJSON(file string, into any) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, into)
}

// readBlob reads a blob of the layout and checks it against its digest.
func readBlob(dir, digest string) ([]byte, error) {
	hexDigest, ok := strings.CutPrefix(digest, "sha256:")
	if !ok {
		return nil, fmt.Errorf("digest %q is not sha256", digest)
	}
	data, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", hexDigest))
	if err != nil {
		return nil, err
	}
	if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != hexDigest {
		return nil, fmt.Errorf("blob %s has digest sha256:%x", digest, got)
	}
	return data, nil
}

func readBlobJSON(dir, digest string, into any) error {
	data, err := readBlob(dir, digest)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, into)
}

// extract unpacks a gzipped layer into the rootfs, checking the
// uncompressed tar against its diff_id. It knows directories and regular
// files, all the image has; anything else is an error, not skipped.
func (img *image) extract(blob []byte, diffID string) error {
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		return err
	}
	hash := sha256.New()
	tr := tar.NewReader(io.TeeReader(zr, hash))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + hdr.Name)
		if name != "/"+strings.TrimSuffix(hdr.Name, "/") {
			return fmt.Errorf("entry %q is not a clean relative path", hdr.Name)
		}
		img.headers[name] = hdr
		target := filepath.Join(img.rootfs, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q has type %q, which this test does not unpack", hdr.Name, hdr.Typeflag)
		}
		if err := os.Chmod(target, hdr.FileInfo().Mode().Perm()|hdr.FileInfo().Mode()&(os.ModeSticky|os.ModeSetuid|os.ModeSetgid)); err != nil {
			return err
		}
	}
	// The tar's end-of-archive padding is part of the diff_id.
	if _, err := io.Copy(io.Discard, zr); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(hash.Sum(nil)); got != diffID {
		return fmt.Errorf("uncompressed layer is %s, diff_id says %s", got, diffID)
	}
	return nil
}

// uidGID parses the config's User, which must be numeric: the kubelet
// enforces runAsNonRoot (config/manager sets it) only for a numeric user, and
// refuses to start a container whose user is a name.
func (img *image) uidGID(t *testing.T) (uid, gid int) {
	t.Helper()
	u, g, ok := strings.Cut(img.config.Config.User, ":")
	var err1, err2 error
	uid, err1 = strconv.Atoi(u)
	gid, err2 = strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("image user %q is not numeric uid:gid", img.config.Config.User)
	}
	return uid, gid
}

// command runs the image as a container runtime would, with a pod's command
// and args (either may be empty): chrooted into the unpacked rootfs, in the
// image's working directory, as the image's user, with the image's
// environment and env. A user namespace maps that user to ours, so no root
// privilege is needed; files we own are its own inside. Nothing of the
// host's file system is visible, not even /proc, which a runtime would mount.
func (img *image) command(t *testing.T, env, command, args []string) *exec.Cmd {
	t.Helper()
	uid, gid := img.uidGID(t)
	// Kubernetes' rules: a command replaces the entrypoint and the image's
	// Cmd; args replace the Cmd.
	argv := img.config.Config.Entrypoint
	switch {
	case len(command) > 0:
		argv = slices.Concat(command, args)
	case len(args) > 0:
		argv = slices.Concat(argv, args)
	default:
		argv = slices.Concat(argv, img.config.Config.Cmd)
	}
	if len(argv) == 0 {
		t.Fatal("nothing to run: the image has no entrypoint")
	}
	// An absolute path is not looked up on the host: the chroot makes it
	// the image's.
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

// output runs the entrypoint to its end and returns its output and exit code.
func (img *image) output(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := img.command(t, nil, nil, args)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the entrypoint in the image: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not exit:\n%s", args, out.String())
	}
	return out.String(), cmd.ProcessState.ExitCode()
}

// TestImage checks make image's image as a user pulling it would see it, and
// runs its entrypoint.
func TestImage(t *testing.T) {
	cfg := img.config
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/manager"}) || cfg.Config.WorkingDir != "/" {
		t.Errorf("entrypoint %q in %q, want [/manager] in /", cfg.Config.Entrypoint, cfg.Config.WorkingDir)
	}
	if uid, _ := img.uidGID(t); uid == 0 {
		t.Errorf("the image runs as root (%q)", cfg.Config.User)
	}
	if v := cfg.Config.Labels["org.opencontainers.image.version"]; v != testVersion {
		t.Errorf("version label %q, want %q", v, testVersion)
	}
	// The license label names LICENSE's license, as the chart's Artifact
	// Hub annotation does (cmd/manager's TestChartLicense).
	license, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.Config.Labels["org.opencontainers.image.licenses"]; l != "Apache-2.0" || !strings.Contains(string(license), "Apache License\n                           Version 2.0, January 2004") {
		t.Errorf("licenses label %q; LICENSE begins %.80q", l, license)
	}
	if img.refName != testVersion {
		t.Errorf("the OCI index names the image %q, want the tag %q", img.refName, testVersion)
	}

	// The entrypoint is a static executable anyone may run.
	hdr := img.headers["/manager"]
	if hdr == nil || hdr.Typeflag != tar.TypeReg || hdr.FileInfo().Mode().Perm() != 0o755 {
		t.Fatalf("/manager: %+v, want a regular file of mode 0755", hdr)
	}
	bin, err := elf.Open(filepath.Join(img.rootfs, "manager"))
	if err != nil {
		t.Fatal(err)
	}
	defer bin.Close()
	for _, p := range bin.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("/manager is dynamically linked")
		}
	}
	passwd, err := os.ReadFile(filepath.Join(img.rootfs, "etc", "passwd"))
	if uid, gid := img.uidGID(t); err != nil || !regexp.MustCompile(fmt.Sprintf(`(?m)^nonroot:x:%d:%d:`, uid, gid)).Match(passwd) {
		t.Errorf("/etc/passwd does not name the image's user nonroot (%v):\n%s", err, passwd)
	}

	// The docker-load tarball holds the same image under the tag.
	var tarManifest []struct {
		Config   string
		RepoTags []string
	}
	if err := json.Unmarshal(tarMember(t, imageTar, "manifest.json"), &tarManifest); err != nil {
		t.Fatal(err)
	}
	if len(tarManifest) != 1 || tarManifest[0].Config != img.configDigest || !slices.Equal(tarManifest[0].RepoTags, []string{testImage}) {
		t.Errorf("the tarball's manifest.json is %+v, want config %s tagged %s", tarManifest, img.configDigest, testImage)
	}

	out, code := img.output(t, "--help")
	if code != 0 {
		t.Errorf("--help exited %d", code)
	}
	for _, flag := range []string{"-leader-elect", "-health-probe-bind-address", "-metrics-bind-address", "-shared-key"} {
		if !regexp.MustCompile(`(?m)^\s+` + flag + `\b`).MatchString(out) {
			t.Errorf("--help does not show %s:\n%s", flag, out)
		}
	}
	if out, code := img.output(t, "--version"); code != 0 || out != testVersion+"\n" {
		t.Errorf("--version: exit %d, output %q, want %q", code, out, testVersion+"\n")
	}
}

func tarMember(t *testing.T, file, name string) []byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("%s in %s: %v", name, file, err)
		}
		if hdr.Name == name {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
	}
}
