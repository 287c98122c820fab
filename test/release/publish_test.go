package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestPublishRefusesWhatItCannotPublish: make publish names what is
// missing before it builds or pushes anything.
func TestPublishRefusesWhatItCannotPublish(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"COSIGN_KEY=" + filepath.Join(t.TempDir(), "absent.key")}, "no cosign key"},
		{[]string{"COSIGN_KEY=" + keys.private, "CHANGELOG=" + filepath.Join(root, "test", "release", "testdata", "no-section.md")}, "has no section '## " + version + "'"},
	} {
		out, err := runMake(append([]string{"publish", "VERSION=" + version, "RELEASE_DIR=" + t.TempDir()}, c.args...)...)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("make publish %v: want a refusal saying %q, got %v:\n%s", c.args, c.want, err, out)
		}
	}
	// REGISTRY is required: the default names the project's own.
	cmd := exec.Command("make", "--no-print-directory", "-C", root, "publish", "VERSION="+version, "COSIGN_KEY="+keys.private, "RELEASE_DIR="+t.TempDir())
	cmd.Env = slices.DeleteFunc(toolEnv(), func(e string) bool { return strings.HasPrefix(e, "REGISTRY=") })
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "name the registry to publish to") {
		t.Errorf("make publish without REGISTRY: want a refusal, got %v:\n%s", err, out)
	}
}

// TestPublishedRelease publishes the release to the test's registry with
// make publish, then reads back what a user would pull: both images as
// multi-arch indexes, every one of them and the chart and the release's
// files signed with the key pair (and not with another), the SBOMs
// attested on the manager's images, the files and their checksums, and
// the krew manifest, whose URLs serve the archives it names.
func TestPublishedRelease(t *testing.T) {
	dir := publishedBuild(t)
	t.Logf("make publish:\n%s", tail(published.out, 6))

	// The manager: the index the release built, by tag, of two platforms.
	index, indexDigest := reg.manifest(t, managerRepo, version)
	if want := strings.TrimSpace(read(t, dir, "image-digest")); indexDigest != want {
		t.Errorf("%s:%s is %s; the release built %s", managerRepo, version, indexDigest, want)
	}
	managerImages := platforms(t, index, "manager")
	// The CLI image: /lockwarden of each linux platform, as the release
	// built it.
	cliIndex, cliDigest := reg.manifest(t, cliRepo, version)
	if want := strings.TrimSpace(read(t, dir, "cli-image-digest")); cliDigest != want {
		t.Errorf("%s:%s is %s; the release built %s", cliRepo, version, cliDigest, want)
	}
	for arch, digest := range platforms(t, cliIndex, "CLI") {
		m, _ := reg.manifest(t, cliRepo, digest)
		var cfg struct {
			Config struct {
				Entrypoint []string
				User       string
			}
		}
		if err := json.Unmarshal(reg.blob(t, cliRepo, m.Config.Digest), &cfg); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.Config.Entrypoint, []string{"/lockwarden"}) || cfg.Config.User != "65532:65532" {
			t.Errorf("the %s CLI image runs %v as %q", arch, cfg.Config.Entrypoint, cfg.Config.User)
		}
		if len(m.Layers) != 1 {
			t.Fatalf("the %s CLI image has %d layers", arch, len(m.Layers))
		}
		files := tgzBytes(t, reg.blob(t, cliRepo, m.Layers[0].Digest))
		if files["lockwarden"] == nil || files["manager"] != nil {
			t.Fatalf("the %s CLI image holds %v, want /lockwarden and no manager", arch, keysOf(files))
		}
		if want := fileDigest(t, filepath.Join(dir, "cli", "lockwarden-linux-"+arch)); sha(files["lockwarden"]) != want {
			t.Errorf("the %s CLI image's /lockwarden is not the release's cli/lockwarden-linux-%s", arch, arch)
		}
	}

	// Signatures: each artifact verifies with the release's public key,
	// none with another key.
	chartDigest := chartDigest(t)
	_, filesDigest := reg.manifest(t, releaseRepo, version)
	signed := []string{managerRepo + "@" + indexDigest, cliRepo + "@" + cliDigest, chartRepo + "@" + chartDigest, releaseRepo + "@" + filesDigest}
	for _, d := range managerImages {
		signed = append(signed, managerRepo+"@"+d)
	}
	for _, ref := range signed {
		ref = reg.host + "/" + ref
		out, err := cosign("verify", "--key", keys.public, "--insecure-ignore-tlog=true", ref)
		if err != nil {
			t.Errorf("cosign verify %s: %v\n%s", ref, err, out)
		}
		if out, err := cosign("verify", "--key", keys.other, "--insecure-ignore-tlog=true", ref); err == nil {
			t.Errorf("cosign verify %s with another key passed:\n%s", ref, out)
		}
	}

	// The SBOMs: attested on each manager image and on the index, the
	// predicate the release's SBOM of that architecture, signed with the
	// key, and stored as referrers of what they describe.
	for arch, d := range managerImages {
		sbom := canonicalJSON(t, []byte(read(t, dir, "manager-linux-"+arch+".cdx.json")))
		for _, subject := range []string{d, indexDigest} {
			ref := reg.host + "/" + managerRepo + "@" + subject
			out, err := cosign("verify-attestation", "--key", keys.public, "--insecure-ignore-tlog=true", "--type", "cyclonedx", ref)
			if err != nil {
				t.Errorf("cosign verify-attestation %s: %v\n%s", ref, err, out)
				continue
			}
			if !slices.Contains(attestedPredicates(t, out, subject), sbom) {
				t.Errorf("no attestation on %s (%s) holds manager-linux-%s.cdx.json", ref, arch, arch)
			}
			if refs := reg.referrers(t, managerRepo, subject); len(refs) < 2 {
				t.Errorf("%s has %d referrers; want its signature and SBOM attestations: %+v", ref, len(refs), refs)
			}
		}
		if out, err := cosign("verify-attestation", "--key", keys.other, "--insecure-ignore-tlog=true", "--type", "cyclonedx", reg.host+"/"+managerRepo+"@"+d); err == nil {
			t.Errorf("the %s SBOM attestation verified with another key:\n%s", arch, out)
		}
	}

	// The release's files: every file SHA256SUMS lists, and the sums hold
	// for what the registry serves.
	art, _ := reg.manifest(t, releaseRepo, version)
	served := map[string][]byte{}
	for _, l := range art.Layers {
		served[l.Annotations["org.opencontainers.image.title"]] = reg.blob(t, releaseRepo, l.Digest)
	}
	sums := string(served["SHA256SUMS"])
	if sums == "" || sums != read(t, dir, "SHA256SUMS") {
		t.Fatalf("the release artifact's SHA256SUMS is not the release's: %q", sums)
	}
	sc := bufio.NewScanner(strings.NewReader(sums))
	listed := 0
	for sc.Scan() {
		sum, name, _ := strings.Cut(sc.Text(), "  ")
		listed++
		if data, ok := served[name]; !ok || sha(data) != sum {
			t.Errorf("the release artifact's %s does not match SHA256SUMS (served: %v)", name, ok)
		}
	}
	if len(served) != listed+1 {
		t.Errorf("the release artifact holds %v; SHA256SUMS lists %d files", keysOf(served), listed)
	}
	if notes := string(served["release-notes.md"]); strings.TrimSpace(notes) != strings.TrimSpace(releaseNotes) {
		t.Errorf("the published release notes: %q, want the CHANGELOG's section %q", notes, releaseNotes)
	}
	checkKrew(t, dir, served)
}

// checkKrew checks the published krew manifest: one platform per CLI
// archive (linux and darwin, amd64 and arm64), each with the archive's
// URL, from which the archive downloads with the manifest's SHA-256, and
// whose kubectl-lockwarden is the release's CLI of that platform.
func checkKrew(t *testing.T, dir string, served map[string][]byte) {
	t.Helper()
	var manifest struct {
		APIVersion string
		Kind       string
		Metadata   struct{ Name string }
		Spec       struct {
			Version   string
			Homepage  string
			Platforms []struct {
				Selector struct {
					MatchLabels map[string]string
				}
				URI, SHA256, Bin string
				Files            []struct{ From, To string }
			}
		}
	}
	if err := yaml.Unmarshal(served["lockwarden.yaml"], &manifest); err != nil {
		t.Fatalf("lockwarden.yaml: %v", err)
	}
	if manifest.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || manifest.Kind != "Plugin" ||
		manifest.Metadata.Name != "lockwarden" || manifest.Spec.Version != version || manifest.Spec.Homepage == "" {
		t.Errorf("lockwarden.yaml: %+v", manifest)
	}
	var got []string
	for _, p := range manifest.Spec.Platforms {
		goos, arch := p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"]
		got = append(got, goos+"/"+arch)
		name := "kubectl-lockwarden_" + goos + "_" + arch + ".tar.gz"
		if p.URI != downloads.base+"/"+name {
			t.Errorf("%s/%s: uri %s, want the release's %s", goos, arch, p.URI, name)
		}
		resp, err := http.Get(p.URI)
		if err != nil {
			t.Fatal(err)
		}
		archive, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s %v", p.URI, resp.Status, err)
		}
		if sha(archive) != p.SHA256 {
			t.Errorf("%s/%s: %s downloads with SHA-256 %s; the manifest says %s", goos, arch, p.URI, sha(archive), p.SHA256)
		}
		if !bytes.Equal(archive, served[name]) {
			t.Errorf("%s/%s: %s is not the release's %s", goos, arch, p.URI, name)
		}
		files := tgzBytes(t, archive)
		if p.Bin != "kubectl-lockwarden" || files[p.Bin] == nil {
			t.Errorf("%s/%s: bin %q, the archive holds %v", goos, arch, p.Bin, keysOf(files))
		}
		if sha(files["kubectl-lockwarden"]) != fileDigest(t, filepath.Join(dir, "cli", "lockwarden-"+goos+"-"+arch)) {
			t.Errorf("%s's kubectl-lockwarden is not the release's CLI for %s/%s", name, goos, arch)
		}
		for _, f := range p.Files {
			if files[f.From] == nil || f.To != "." {
				t.Errorf("%s/%s: files entry %+v; the archive holds %v", goos, arch, f, keysOf(files))
			}
		}
		if len(p.Files) != len(files) {
			t.Errorf("%s/%s: %d files entries for the archive's %d files", goos, arch, len(p.Files), len(files))
		}
	}
	slices.Sort(got)
	if want := []string{"darwin/amd64", "darwin/arm64", "linux/amd64", "linux/arm64"}; !slices.Equal(got, want) {
		t.Errorf("the krew manifest's platforms: %v, want %v", got, want)
	}
}

// platforms checks an index lists linux/amd64 and linux/arm64 and returns
// their manifests' digests by architecture.
func platforms(t *testing.T, idx ociManifestOrIndex, what string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range idx.Manifests {
		if m.Platform == nil || m.Platform.OS != "linux" || m.MediaType != ociManifest {
			t.Errorf("the %s index lists %+v", what, m)
			continue
		}
		out[m.Platform.Architecture] = m.Digest
	}
	if len(out) != 2 || out["amd64"] == "" || out["arm64"] == "" || len(idx.Manifests) != 2 {
		t.Fatalf("the %s index holds %v; want linux/amd64 and linux/arm64", what, out)
	}
	return out
}

// chartDigest is the digest of the chart `helm push` published, as the
// registry reports it for the chart's version.
func chartDigest(t *testing.T) string {
	t.Helper()
	m, digest := reg.manifest(t, chartRepo, strings.TrimPrefix(version, "v"))
	if m.Config.MediaType != "application/vnd.cncf.helm.config.v1+json" {
		t.Errorf("%s is not a Helm chart: config %s", chartRepo, m.Config.MediaType)
	}
	return digest
}

// cosign runs bin/cosign, trusting the registry.
func cosign(args ...string) (string, error) {
	cmd := exec.Command(cosignBin(), args...)
	cmd.Env = toolEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// attestedPredicates returns the predicates, canonical JSON, of the
// in-toto statements cosign verify-attestation printed (one DSSE envelope
// a line) whose subject is digest.
func attestedPredicates(t *testing.T, out, digest string) []string {
	t.Helper()
	var preds []string
	for _, line := range strings.Split(out, "\n") {
		var env struct{ PayloadType, Payload string }
		if json.Unmarshal([]byte(line), &env) != nil || env.Payload == "" {
			continue
		}
		payload, err := base64.StdEncoding.DecodeString(env.Payload)
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			PredicateType string
			Subject       []struct{ Digest map[string]string }
			Predicate     json.RawMessage
		}
		if err := json.Unmarshal(payload, &st); err != nil {
			t.Fatal(err)
		}
		for _, s := range st.Subject {
			if "sha256:"+s.Digest["sha256"] == digest {
				preds = append(preds, canonicalJSON(t, st.Predicate))
			}
		}
	}
	return preds
}

// canonicalJSON re-encodes JSON with sorted keys and no spaces, so that
// two encodings of one document compare equal.
func canonicalJSON(t *testing.T, data []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// tgzBytes returns the regular files of a gzipped tar by name.
func tgzBytes(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimPrefix(hdr.Name, "./")] = body
	}
}

func keysOf[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestVerifyAsTheDocsSay runs docs/releasing.md's verification commands,
// as written but for its first line, which names the registry and the
// version: they pass with the release's cosign.pub, and fail with another.
func TestVerifyAsTheDocsSay(t *testing.T) {
	publishedBuild(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "releasing.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- test/release: verify -->\n```sh\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/releasing.md has no verify block")
	}
	first, rest, _ := strings.Cut(string(m[1]), "\n")
	if !strings.HasPrefix(first, "REGISTRY=") || !strings.Contains(first, " VERSION=") {
		t.Fatalf("the verify block's first line does not set REGISTRY and VERSION: %q", first)
	}
	script := "REGISTRY=" + reg.host + "/lockwarden VERSION=" + version + "\n" + rest
	for _, c := range []struct {
		key  string
		pass bool
	}{{keys.public, true}, {keys.other, false}} {
		dir := t.TempDir()
		pub, err := os.ReadFile(c.key)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cosign.pub"), pub, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
		cmd.Dir = dir
		cmd.Env = append(toolEnv(), "PATH="+filepath.Join(root, "bin")+":/usr/local/bin:/usr/bin:/bin")
		out, err := cmd.CombinedOutput()
		if (err == nil) != c.pass {
			t.Errorf("the docs' verification with %s: %v (want it to pass: %v)\n%s", filepath.Base(c.key), err, c.pass, out)
		}
	}
}
