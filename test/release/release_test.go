// Package release checks `make release` and `make publish`: every artifact
// of a release from one version, as the README's "Releases" and
// docs/releasing.md list them, the same bytes from the same commit, the
// release published to a registry on this machine, signed, and installed
// from there onto the local control plane.
package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// The version the tests release.
const version = "v0.0.0-repro"

// imageRepo is the manager image's repository in the test's registry.
func imageRepo() string { return reg.host + "/" + managerRepo }

// TestReleaseIsReproducible builds the release twice, into two
// directories, once with `make release` and once with `make publish`, and
// requires the same bytes, then checks what each artifact holds.
func TestReleaseIsReproducible(t *testing.T) {
	if out, err := runMake("release", "VERSION=1.2.3", "RELEASE_DIR="+t.TempDir()); err == nil || !strings.Contains(out, "is not vMAJOR.MINOR.PATCH") {
		t.Errorf("make release VERSION=1.2.3 was not refused: %v\n%s", err, out)
	}
	a, b := releasedBuild(t), publishedBuild(t)
	ha, hb := treeDigests(t, a), treeDigests(t, b)
	if len(ha) < 10 {
		t.Fatalf("the release holds only %v", ha)
	}
	for name, d := range ha {
		if hb[name] != d {
			t.Errorf("%s differs between two builds of the same commit: %s, then %s", name, d, hb[name])
		}
	}
	for name := range hb {
		if _, ok := ha[name]; !ok {
			t.Errorf("%s is in the second build only", name)
		}
	}
	t.Logf("image %s, the same twice; %d files compared", strings.TrimSpace(read(t, a, "image-digest")), len(ha))

	checkSums(t, a)
	checkBinaries(t, a)
	digest := checkImage(t, a)
	checkSBOMs(t, a)
	checkInstaller(t, a, digest)
	checkChart(t, a, digest)
	if notes := read(t, a, "release-notes.md"); strings.TrimSpace(notes) != strings.TrimSpace(releaseNotes) {
		t.Errorf("release-notes.md is not the CHANGELOG's section for %s: %q", version, notes)
	}
}

// treeDigests maps every file under dir to its SHA-256.
func treeDigests(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out[rel] = fileDigest(t, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func fileDigest(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func read(t *testing.T, dir, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// SHA256SUMS lists every file of the release with its digest.
func checkSums(t *testing.T, dir string) {
	t.Helper()
	listed := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(read(t, dir, "SHA256SUMS")))
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		listed[name] = true
		if got := fileDigest(t, filepath.Join(dir, name)); got != sum {
			t.Errorf("SHA256SUMS says %s for %s, which is %s", sum, name, got)
		}
	}
	for _, want := range []string{"manager-linux-amd64", "manager-linux-arm64", "manager-linux-amd64.cdx.json", "manager-linux-arm64.cdx.json",
		"manager-image.oci.tar", "image-digest", "install.yaml", "lockwarden-0.0.0-repro.tgz", "release-notes.md",
		"kubectl-lockwarden_linux_amd64.tar.gz", "kubectl-lockwarden_linux_arm64.tar.gz", "kubectl-lockwarden_darwin_amd64.tar.gz",
		"kubectl-lockwarden_darwin_arm64.tar.gz", "lockwarden.yaml", "cli-image-digest"} {
		if !listed[want] {
			t.Errorf("SHA256SUMS lacks %s", want)
		}
	}
}

// The binaries: static, stripped, for their architecture, stamped.
func checkBinaries(t *testing.T, dir string) {
	t.Helper()
	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		path := filepath.Join(dir, "manager-linux-"+arch)
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if f.Machine != machine {
			t.Errorf("%s is for %v", path, f.Machine)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked", path)
			}
		}
		for _, s := range f.Sections {
			if s.Name == ".symtab" || strings.HasPrefix(s.Name, ".debug_") || strings.HasPrefix(s.Name, ".zdebug_") {
				t.Errorf("%s is not stripped: it has %s", path, s.Name)
			}
		}
		f.Close()
		if arch == runtime.GOARCH {
			out, err := exec.Command(path, "--version").Output()
			if err != nil || strings.TrimSpace(string(out)) != version {
				t.Errorf("%s --version: %q (%v)", path, out, err)
			}
		}
	}
	// The CLI built for this machine reports the release's version too.
	cli := filepath.Join(dir, "cli", "lockwarden-"+runtime.GOOS+"-"+runtime.GOARCH)
	if out, err := exec.Command(cli, "version").Output(); err != nil || strings.TrimSpace(string(out)) != version {
		t.Errorf("%s version: %q (%v), want %s", cli, out, err, version)
	}
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Annotations map[string]string `json:"annotations"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

// The image: an OCI layout whose index names one multi-arch index of an
// image per architecture, each with the labels and the binary of its
// architecture; the tar holds the same layout. Returns the index's digest.
func checkImage(t *testing.T, dir string) string {
	t.Helper()
	layout := filepath.Join(dir, "image")
	var top struct{ Manifests []descriptor }
	blobJSON(t, filepath.Join(layout, "index.json"), &top)
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != "application/vnd.oci.image.index.v1+json" ||
		top.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != version {
		t.Fatalf("the layout's index.json: %+v", top.Manifests)
	}
	digest := top.Manifests[0].Digest
	if strings.TrimSpace(read(t, dir, "image-digest")) != digest {
		t.Errorf("image-digest %q, the index is %s", read(t, dir, "image-digest"), digest)
	}
	var index struct{ Manifests []descriptor }
	blobJSON(t, blobPath(layout, digest), &index)
	var archs []string
	for _, m := range index.Manifests {
		if m.Platform == nil || m.Platform.OS != "linux" {
			t.Fatalf("manifest without a linux platform: %+v", m)
		}
		arch := m.Platform.Architecture
		archs = append(archs, arch)
		var manifest struct {
			Config descriptor
			Layers []descriptor
		}
		blobJSON(t, blobPath(layout, m.Digest), &manifest)
		var config struct {
			Architecture string
			Config       struct{ Labels map[string]string }
		}
		blobJSON(t, blobPath(layout, manifest.Config.Digest), &config)
		l := config.Config.Labels
		if config.Architecture != arch || l["org.opencontainers.image.version"] != version ||
			l["org.opencontainers.image.source"] != "https://github.com/lockwarden/lockwarden" || len(l["org.opencontainers.image.revision"]) < 40 {
			t.Errorf("%s image: architecture %s, labels %v", arch, config.Architecture, l)
		}
		if len(manifest.Layers) != 1 {
			t.Fatalf("%s image: %d layers", arch, len(manifest.Layers))
		}
		manager := tgzFiles(t, blobPath(layout, manifest.Layers[0].Digest))["manager"]
		if want := fileDigest(t, filepath.Join(dir, "manager-linux-"+arch)); sha(manager) != want {
			t.Errorf("the %s image's /manager is not manager-linux-%s", arch, arch)
		}
	}
	slices.Sort(archs)
	if !slices.Equal(archs, []string{"amd64", "arm64"}) {
		t.Errorf("the index holds %v, want amd64 and arm64", archs)
	}
	// The tar is the layout.
	f, err := os.Open(filepath.Join(dir, "manager-image.oci.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	files := 0
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		files++
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if sha(data) != fileDigest(t, filepath.Join(layout, hdr.Name)) {
			t.Errorf("manager-image.oci.tar's %s is not the layout's", hdr.Name)
		}
	}
	if files < 7 {
		t.Errorf("manager-image.oci.tar holds %d files", files)
	}
	return digest
}

func blobPath(layout, digest string) string {
	algo, hex, _ := strings.Cut(digest, ":")
	return filepath.Join(layout, "blobs", algo, hex)
}

func blobJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// tgzFiles returns the regular files of a gzipped tar (an image layer, a
// chart package) by name.
func tgzFiles(t *testing.T, path string) map[string][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return tgzBytes(t, data)
}

// The SBOMs: CycloneDX, one per binary, naming the release's version, the
// binary's platform and digest, and the modules it was built from at
// go.mod's versions.
func checkSBOMs(t *testing.T, dir string) {
	t.Helper()
	mods := map[string]string{}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Path}} {{.Version}}", "all").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, v, _ := strings.Cut(line, " ")
		mods[path] = v
	}
	for _, arch := range []string{"amd64", "arm64"} {
		var bom struct {
			BOMFormat   string `json:"bomFormat"`
			SpecVersion string `json:"specVersion"`
			Metadata    struct {
				Component struct {
					Name, Version string
				}
				Properties []struct{ Name, Value string }
			}
			Components []struct {
				Name, Version, Purl string
			}
		}
		blobJSON(t, filepath.Join(dir, "manager-linux-"+arch+".cdx.json"), &bom)
		if bom.BOMFormat != "CycloneDX" || bom.SpecVersion == "" || bom.Metadata.Component.Name != "github.com/lockwarden/lockwarden" || bom.Metadata.Component.Version != version {
			t.Errorf("%s SBOM: %s %s, main component %+v", arch, bom.BOMFormat, bom.SpecVersion, bom.Metadata.Component)
		}
		props := map[string]string{}
		for _, p := range bom.Metadata.Properties {
			props[p.Name] = p.Value
		}
		if props["cdx:gomod:build:env:GOARCH"] != arch || props["cdx:gomod:binary:hash:SHA-256"] != fileDigest(t, filepath.Join(dir, "manager-linux-"+arch)) {
			t.Errorf("%s SBOM describes another binary: %v", arch, props)
		}
		found := map[string]bool{}
		for _, c := range bom.Components {
			if want, ok := mods[c.Name]; ok && c.Version != want {
				t.Errorf("%s SBOM: %s %s, go.mod selects %s", arch, c.Name, c.Version, want)
			}
			if c.Purl != "" && !strings.Contains(c.Purl, "goarch="+arch) && c.Name != "std" {
				t.Errorf("%s SBOM: %s's purl %s", arch, c.Name, c.Purl)
			}
			found[c.Name] = true
		}
		for _, want := range []string{"github.com/redis/go-redis/v9", "sigs.k8s.io/controller-runtime", "k8s.io/client-go", "std"} {
			if !found[want] {
				t.Errorf("%s SBOM lacks %s", arch, want)
			}
		}
	}
}

// install.yaml pins the image by tag and digest.
func checkInstaller(t *testing.T, dir, digest string) {
	t.Helper()
	want := fmt.Sprintf("image: %s:%s@%s", imageRepo(), version, digest)
	if !strings.Contains(read(t, dir, "install.yaml"), want) {
		t.Errorf("install.yaml lacks %q", want)
	}
}

// The chart package: the version, the release's image and digest pinned,
// lint-clean, and it renders the image by digest.
func checkChart(t *testing.T, dir, digest string) {
	t.Helper()
	pkg := filepath.Join(dir, "lockwarden-0.0.0-repro.tgz")
	files := tgzFiles(t, pkg)
	chart, values := string(files["lockwarden/Chart.yaml"]), string(files["lockwarden/values.yaml"])
	if !strings.Contains(chart, "version: 0.0.0-repro") || !strings.Contains(chart, "appVersion: "+version) {
		t.Errorf("the packaged Chart.yaml:\n%s", chart)
	}
	if !strings.Contains(values, `digest: "`+digest+`"`) {
		t.Errorf("the packaged values do not pin %s", digest)
	}
	helm := filepath.Join(root, "bin", "helm")
	home := t.TempDir()
	env := []string{"HOME=" + home, "HELM_CACHE_HOME=" + home, "HELM_CONFIG_HOME=" + home, "HELM_DATA_HOME=" + home}
	lint := exec.Command(helm, "lint", "--strict", "--kube-version", "1.36.0", pkg)
	lint.Env = env
	if out, err := lint.CombinedOutput(); err != nil {
		t.Errorf("helm lint --strict %s: %v\n%s", pkg, err, out)
	}
	tmpl := exec.Command(helm, "template", "lockwarden", pkg, "-n", "lockwarden-system", "--kube-version", "1.36.0")
	tmpl.Env = env
	out, err := tmpl.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte(fmt.Sprintf("image: %q", imageRepo()+":"+version+"@"+digest))) {
		t.Errorf("the packaged chart does not run the released image (%v):\n%s", err, firstLines(out, 5))
	}
}

func firstLines(b []byte, n int) string {
	lines := strings.SplitN(string(b), "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
