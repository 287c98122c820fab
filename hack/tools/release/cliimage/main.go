// Command cliimage builds the CLI image of a release: a multi-arch OCI
// image index, one image per static linux lockwarden binary given, each a
// single layer holding the binary at /lockwarden and nothing else, so that
// a job's image takes it with
//
//	COPY --from=REGISTRY/lockwarden-cli:VERSION /lockwarden /usr/local/bin/lockwarden
//
// and `docker run REGISTRY/lockwarden-cli:VERSION why POD -n NS` runs it.
// The image runs as the nonroot user 65532 (numeric, so that the kubelet
// can check runAsNonRoot). Every time in it is -created
// (SOURCE_DATE_EPOCH), so the same binaries, version and labels give the
// same digest. It writes an OCI image layout (-oci) and the index's digest
// (-digest-file).
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// goarch maps an ELF machine to the image platform's architecture.
var goarch = map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}

type options struct {
	version, source, revision, tag string
	created                        time.Time
}

func main() {
	var binaries []string
	var o options
	var ociDir, digestFile string
	var created int64
	flag.Func("binary", "a static linux lockwarden binary; repeat it, one per architecture", func(s string) error {
		binaries = append(binaries, s)
		return nil
	})
	flag.StringVar(&o.version, "version", "", "the release's version, for the org.opencontainers.image.version label")
	flag.StringVar(&o.source, "source", "", "the source repository's URL, for the org.opencontainers.image.source label")
	flag.StringVar(&o.revision, "revision", "", "the source's commit, for the org.opencontainers.image.revision label")
	flag.StringVar(&o.tag, "tag", "", "the tag the layout names the index by (org.opencontainers.image.ref.name)")
	flag.Int64Var(&created, "created", 0, "the time of every file and of the image, in seconds since the Unix epoch")
	flag.StringVar(&ociDir, "oci", "", "directory to write the OCI image layout to (replaced)")
	flag.StringVar(&digestFile, "digest-file", "", "file to write the index's digest to")
	flag.Parse()
	o.created = time.Unix(created, 0).UTC()
	if len(binaries) == 0 || o.version == "" || o.tag == "" || ociDir == "" || digestFile == "" {
		fmt.Fprintln(os.Stderr, "cliimage: -binary, -version, -tag, -oci and -digest-file are required")
		os.Exit(2)
	}
	if err := run(binaries, o, ociDir, digestFile); err != nil {
		fmt.Fprintln(os.Stderr, "cliimage:", err)
		os.Exit(1)
	}
}

func run(binaries []string, o options, ociDir, digestFile string) error {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var archs []string
	for _, b := range binaries {
		arch, err := staticLinuxArch(b)
		if err != nil {
			return err
		}
		if slices.Contains(archs, arch) {
			return fmt.Errorf("two binaries for linux/%s", arch)
		}
		archs = append(archs, arch)
		data, err := os.ReadFile(b)
		if err != nil {
			return err
		}
		img, err := build(data, o, arch)
		if err != nil {
			return err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	if err := os.RemoveAll(ociDir); err != nil {
		return err
	}
	l, err := layout.Write(ociDir, empty.Index)
	if err != nil {
		return err
	}
	if err := l.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": o.tag})); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("CLI image %s (linux/%v): OCI layout %s\n", digest, archs, ociDir)
	return os.WriteFile(digestFile, []byte(digest.String()+"\n"), 0o644)
}

// staticLinuxArch refuses a binary that would not run from an empty base,
// and returns its architecture.
func staticLinuxArch(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s is not a Linux executable: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("%s is dynamically linked; build it with CGO_ENABLED=0", path)
		}
	}
	arch, ok := goarch[f.Machine]
	if !ok {
		return "", fmt.Errorf("%s is built for %v, not amd64 or arm64", path, f.Machine)
	}
	return arch, nil
}

// build makes one architecture's image: /lockwarden on an empty base.
func build(binary []byte, o options, arch string) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "lockwarden", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(binary)), ModTime: o.created}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(binary); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: o.created}, CreatedBy: "make release", Comment: "the lockwarden CLI on an empty base"},
	})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", arch
	cfg.Created = v1.Time{Time: o.created}
	cfg.Config.Entrypoint = []string{"/lockwarden"}
	cfg.Config.User = "65532:65532"
	cfg.Config.WorkingDir = "/"
	cfg.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   "lockwarden-cli",
		"org.opencontainers.image.version": o.version,
	}
	if o.source != "" {
		cfg.Config.Labels["org.opencontainers.image.source"] = o.source
	}
	if o.revision != "" {
		cfg.Config.Labels["org.opencontainers.image.revision"] = o.revision
	}
	return mutate.ConfigFile(img, cfg)
}
