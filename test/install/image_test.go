package install

import (
	"archive/tar"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/podrun"
)

// image is an image unpacked from an OCI layout by unpackOCI, which reads it
// with the standard library only, as a container runtime would: it checks
// every digest, so it does not trust the builder's own library.
type image struct {
	refName      string // the index's org.opencontainers.image.ref.name
	configDigest string
	config       struct {
		OS           string             `json:"os"`
		Architecture string             `json:"architecture"`
		Config       podrun.ImageConfig `json:"config"`
		RootFS       struct {
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
		headers, err := podrun.UnpackLayer(blob, img.config.RootFS.DiffIDs[i], rootfs)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		maps.Copy(img.headers, headers)
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

// runnable is the image as podrun runs it.
func (img *image) runnable() *podrun.Image {
	return &podrun.Image{Rootfs: img.rootfs, Config: img.config.Config}
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
	if uid, _ := img.runnable().UIDGID(t); uid == 0 {
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
	if uid, gid := img.runnable().UIDGID(t); err != nil || !regexp.MustCompile(fmt.Sprintf(`(?m)^nonroot:x:%d:%d:`, uid, gid)).Match(passwd) {
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

	out, code := img.runnable().Output(t, 30*time.Second, nil, []string{"--help"})
	if code != 0 {
		t.Errorf("--help exited %d", code)
	}
	for _, flag := range []string{"-leader-elect", "-health-probe-bind-address", "-metrics-bind-address", "-shared-key"} {
		if !regexp.MustCompile(`(?m)^\s+` + flag + `\b`).MatchString(out) {
			t.Errorf("--help does not show %s:\n%s", flag, out)
		}
	}
	if out, code := img.runnable().Output(t, 30*time.Second, nil, []string{"--version"}); code != 0 || out != testVersion+"\n" {
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
