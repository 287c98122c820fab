// Command publish pushes a release that `make release` built (-dir) to the
// registry its user names (-registry, e.g. ghcr.io/lockwarden), signs what
// it pushed with cosign and a key pair, and attaches the SBOMs:
//
//	REGISTRY/manager:VERSION             the manager's multi-arch image index (the layout dir/image)
//	REGISTRY/lockwarden-cli:VERSION      the CLI's multi-arch image, /lockwarden (the layout dir/cli-image)
//	REGISTRY/charts/lockwarden:X.Y.Z     the chart, with `helm push`
//	REGISTRY/lockwarden-release:VERSION  every file SHA256SUMS lists, and SHA256SUMS, as one OCI
//	                                     artifact whose layers are the files, named by their
//	                                     org.opencontainers.image.title (`oras pull` writes them out)
//
// Each of the four is signed by digest with `cosign sign --key` (the two
// image indexes recursively: each platform's image too). The manager's
// SBOMs (dir/manager-linux-ARCH.cdx.json) are attached with `cosign attest
// --type cyclonedx` to the image of their architecture and to the index.
// Signatures and attestations are Sigstore bundles stored as OCI referrers
// of what they sign; nothing is sent to a transparency log or to Fulcio
// (--tlog-upload=false, --use-signing-config=false), so publishing needs
// nothing but the registry, and a user verifies with the public key alone.
//
// Registry credentials are docker's (~/.docker/config.json: `docker
// login` or `crane auth login`) for the images and cosign, helm's (`helm
// registry login`) for the chart. The key's password, if any, is
// $COSIGN_PASSWORD.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The repositories under -registry.
const (
	managerRepo = "manager"
	cliRepo     = "lockwarden-cli"
	chartRepo   = "charts"
	releaseRepo = "lockwarden-release"
)

// releaseArtifactType is the artifactType of the release's files artifact.
const releaseArtifactType = "application/vnd.lockwarden.release.v1"

type publisher struct {
	ctx               context.Context
	dir, registry     string
	version           string
	cosign, helm, key string
	remote            []remote.Option
	stdout            io.Writer
}

func main() {
	p := &publisher{ctx: context.Background(), stdout: os.Stdout}
	flag.StringVar(&p.dir, "dir", "", "the release directory `make release` wrote")
	flag.StringVar(&p.registry, "registry", "", "where to publish, HOST[/PATH], e.g. ghcr.io/lockwarden")
	flag.StringVar(&p.version, "version", "", "the release's version, vX.Y.Z")
	flag.StringVar(&p.cosign, "cosign", "cosign", "the cosign binary")
	flag.StringVar(&p.helm, "helm", "helm", "the helm binary")
	flag.StringVar(&p.key, "key", "", "cosign's private key file (its password in $COSIGN_PASSWORD)")
	flag.Parse()
	if p.dir == "" || p.registry == "" || p.version == "" || p.key == "" {
		fmt.Fprintln(os.Stderr, "usage: publish -dir RELEASE_DIR -registry HOST[/PATH] -version vX.Y.Z -key cosign.key [-cosign PATH] [-helm PATH]")
		os.Exit(2)
	}
	p.remote = []remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithContext(p.ctx)}
	if err := p.run(); err != nil {
		fmt.Fprintln(os.Stderr, "publish:", err)
		os.Exit(1)
	}
}

func (p *publisher) run() error {
	if _, err := name.NewRepository(p.registry + "/" + managerRepo); err != nil {
		return fmt.Errorf("-registry %q: %w", p.registry, err)
	}
	if _, err := os.Stat(p.key); err != nil {
		return fmt.Errorf("the cosign key: %w (make one with `cosign generate-key-pair`)", err)
	}
	manager, err := p.pushLayout("image", managerRepo)
	if err != nil {
		return fmt.Errorf("the manager image: %w", err)
	}
	want, err := p.read("image-digest")
	if err != nil {
		return err
	}
	if manager.DigestStr() != strings.TrimSpace(want) {
		return fmt.Errorf("pushed the manager index as %s, but the release's image-digest says %s", manager.DigestStr(), want)
	}
	cli, err := p.pushLayout("cli-image", cliRepo)
	if err != nil {
		return fmt.Errorf("the CLI image: %w", err)
	}
	chart, err := p.pushChart()
	if err != nil {
		return fmt.Errorf("the chart: %w", err)
	}
	files, err := p.pushFiles()
	if err != nil {
		return fmt.Errorf("the release's files: %w", err)
	}

	for _, d := range []name.Digest{manager, cli} {
		if err := p.sign(d, true); err != nil {
			return err
		}
	}
	for _, d := range []name.Digest{chart, files} {
		if err := p.sign(d, false); err != nil {
			return err
		}
	}
	if err := p.attestSBOMs(manager); err != nil {
		return err
	}
	fmt.Fprintf(p.stdout, "published %s:\n  manager image  %s:%s@%s\n  CLI image      %s:%s@%s\n  chart          oci://%s (%s)\n  release files  %s:%s@%s\n",
		p.version, manager.Context(), p.version, manager.DigestStr(), cli.Context(), p.version, cli.DigestStr(),
		chart.Context(), chart.DigestStr(), files.Context(), p.version, files.DigestStr())
	return nil
}

func (p *publisher) read(file string) (string, error) {
	data, err := os.ReadFile(filepath.Join(p.dir, file))
	return string(data), err
}

// pushLayout pushes the one image index of the OCI layout dir/sub to
// REGISTRY/repo:VERSION and returns it by digest.
func (p *publisher) pushLayout(sub, repo string) (name.Digest, error) {
	root, err := layout.ImageIndexFromPath(filepath.Join(p.dir, sub))
	if err != nil {
		return name.Digest{}, err
	}
	m, err := root.IndexManifest()
	if err != nil {
		return name.Digest{}, err
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsIndex() {
		return name.Digest{}, fmt.Errorf("%s holds %d manifests; want one image index", sub, len(m.Manifests))
	}
	idx, err := root.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		return name.Digest{}, err
	}
	tag, err := name.NewTag(p.registry + "/" + repo + ":" + p.version)
	if err != nil {
		return name.Digest{}, err
	}
	if err := remote.WriteIndex(tag, idx, p.remote...); err != nil {
		return name.Digest{}, err
	}
	return tag.Context().Digest(m.Manifests[0].Digest.String()), nil
}

// helmDigest is the line `helm push` reports the chart's digest on.
var helmDigest = regexp.MustCompile(`(?m)^Digest: (sha256:[0-9a-f]{64})$`)

// pushChart pushes the release's chart package with `helm push` to
// oci://REGISTRY/charts, and returns it by digest.
func (p *publisher) pushChart() (name.Digest, error) {
	pkg := filepath.Join(p.dir, "lockwarden-"+strings.TrimPrefix(p.version, "v")+".tgz")
	if _, err := os.Stat(pkg); err != nil {
		return name.Digest{}, err
	}
	out, err := p.command(p.helm, "push", pkg, "oci://"+p.registry+"/"+chartRepo)
	if err != nil {
		return name.Digest{}, err
	}
	m := helmDigest.FindStringSubmatch(out)
	if m == nil {
		return name.Digest{}, fmt.Errorf("helm push reported no digest:\n%s", out)
	}
	return name.NewDigest(p.registry + "/" + chartRepo + "/lockwarden@" + m[1])
}

// pushFiles pushes the files SHA256SUMS lists, and SHA256SUMS, as one OCI
// artifact, REGISTRY/lockwarden-release:VERSION, each file a layer with its
// name as its title, and returns it by digest.
func (p *publisher) pushFiles() (name.Digest, error) {
	sums, err := p.read("SHA256SUMS")
	if err != nil {
		return name.Digest{}, err
	}
	names := []string{"SHA256SUMS"}
	for _, line := range strings.Split(strings.TrimSpace(sums), "\n") {
		_, file, ok := strings.Cut(line, "  ")
		if !ok {
			return name.Digest{}, fmt.Errorf("SHA256SUMS line %q", line)
		}
		names = append(names, file)
	}
	sort.Strings(names)
	tag, err := name.NewTag(p.registry + "/" + releaseRepo + ":" + p.version)
	if err != nil {
		return name.Digest{}, err
	}
	empty := bytesLayer{data: []byte("{}"), mediaType: "application/vnd.oci.empty.v1+json"}
	if err := remote.WriteLayer(tag.Context(), empty, p.remote...); err != nil {
		return name.Digest{}, err
	}
	manifest := artifactManifest{
		SchemaVersion: 2, MediaType: types.OCIManifestSchema1, ArtifactType: releaseArtifactType,
		Config:      descriptorOf(empty),
		Annotations: map[string]string{"org.opencontainers.image.version": p.version},
	}
	for _, n := range names {
		l, err := newFileLayer(filepath.Join(p.dir, n))
		if err != nil {
			return name.Digest{}, err
		}
		if err := remote.WriteLayer(tag.Context(), l, p.remote...); err != nil {
			return name.Digest{}, fmt.Errorf("%s: %w", n, err)
		}
		d := descriptorOf(l)
		d.Annotations = map[string]string{"org.opencontainers.image.title": n}
		manifest.Layers = append(manifest.Layers, d)
	}
	raw, err := json.Marshal(manifest)
	if err != nil {
		return name.Digest{}, err
	}
	if err := remote.Put(tag, rawManifest{raw: raw, mediaType: types.OCIManifestSchema1}, p.remote...); err != nil {
		return name.Digest{}, err
	}
	sum := sha256.Sum256(raw)
	return tag.Context().Digest("sha256:" + hex.EncodeToString(sum[:])), nil
}

// sign signs d with the key, recursively (an index and each of its images)
// if asked.
func (p *publisher) sign(d name.Digest, recursive bool) error {
	args := []string{"sign", "--key", p.key, "--yes", "--tlog-upload=false", "--use-signing-config=false"}
	if recursive {
		args = append(args, "--recursive")
	}
	if _, err := p.command(p.cosign, append(args, d.String())...); err != nil {
		return fmt.Errorf("signing %s: %w", d, err)
	}
	return nil
}

// attestSBOMs attaches each architecture's SBOM to that architecture's
// image in the index, and to the index itself.
func (p *publisher) attestSBOMs(index name.Digest) error {
	desc, err := remote.Get(index, p.remote...)
	if err != nil {
		return err
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		return err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, img := range m.Manifests {
		if img.Platform == nil {
			return fmt.Errorf("the manager index lists %s without a platform", img.Digest)
		}
		sbom := filepath.Join(p.dir, "manager-"+img.Platform.OS+"-"+img.Platform.Architecture+".cdx.json")
		for _, subject := range []name.Digest{index.Context().Digest(img.Digest.String()), index} {
			if _, err := p.command(p.cosign, "attest", "--key", p.key, "--yes", "--tlog-upload=false", "--use-signing-config=false",
				"--type", "cyclonedx", "--predicate", sbom, subject.String()); err != nil {
				return fmt.Errorf("attaching %s to %s: %w", filepath.Base(sbom), subject, err)
			}
		}
	}
	return nil
}

// command runs a tool, returning its output, which it also shows.
func (p *publisher) command(tool string, args ...string) (string, error) {
	cmd := exec.CommandContext(p.ctx, tool, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(&out, p.stdout), io.MultiWriter(&out, p.stdout)
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w", filepath.Base(tool), args[0], err)
	}
	return out.String(), nil
}

// artifactManifest is an OCI 1.1 image manifest of an artifact: an empty
// config, the files as layers.
type artifactManifest struct {
	SchemaVersion int64             `json:"schemaVersion"`
	MediaType     types.MediaType   `json:"mediaType"`
	ArtifactType  string            `json:"artifactType"`
	Config        v1.Descriptor     `json:"config"`
	Layers        []v1.Descriptor   `json:"layers"`
	Annotations   map[string]string `json:"annotations"`
}

type rawManifest struct {
	raw       []byte
	mediaType types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.raw, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mediaType, nil }

// descriptorOf describes a blob in a manifest. The layers here know their
// digest, size and media type without fail.
func descriptorOf(b v1.Layer) v1.Descriptor {
	d, _ := b.Digest()
	s, _ := b.Size()
	mt, _ := b.MediaType()
	return v1.Descriptor{MediaType: mt, Digest: d, Size: s}
}

// bytesLayer is a blob held in memory.
type bytesLayer struct {
	data      []byte
	mediaType types.MediaType
}

func (b bytesLayer) Digest() (v1.Hash, error) {
	h, _, err := v1.SHA256(bytes.NewReader(b.data))
	return h, err
}
func (b bytesLayer) DiffID() (v1.Hash, error) { return b.Digest() }
func (b bytesLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b.data)), nil
}
func (b bytesLayer) Uncompressed() (io.ReadCloser, error) { return b.Compressed() }
func (b bytesLayer) Size() (int64, error)                 { return int64(len(b.data)), nil }
func (b bytesLayer) MediaType() (types.MediaType, error)  { return b.mediaType, nil }

// fileLayer is a file pushed as it is, read from disk when it is sent.
type fileLayer struct {
	path   string
	digest v1.Hash
	size   int64
}

func newFileLayer(path string) (fileLayer, error) {
	f, err := os.Open(path)
	if err != nil {
		return fileLayer{}, err
	}
	defer f.Close()
	h, n, err := v1.SHA256(f)
	return fileLayer{path: path, digest: h, size: n}, err
}

func (f fileLayer) Digest() (v1.Hash, error)             { return f.digest, nil }
func (f fileLayer) DiffID() (v1.Hash, error)             { return f.digest, nil }
func (f fileLayer) Compressed() (io.ReadCloser, error)   { return os.Open(f.path) }
func (f fileLayer) Uncompressed() (io.ReadCloser, error) { return os.Open(f.path) }
func (f fileLayer) Size() (int64, error)                 { return f.size, nil }
func (f fileLayer) MediaType() (types.MediaType, error) {
	return "application/octet-stream", nil
}
