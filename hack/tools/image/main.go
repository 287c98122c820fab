// Command image builds the manager's container image for `make image`, with
// no docker daemon and no network: no base image is pulled, so the image is
// one layer on an empty base, holding what the Dockerfile's image needs from
// gcr.io/distroless/static:nonroot (the static manager, the nonroot user,
// /tmp) and configured as the Dockerfile configures it. It writes an OCI
// image layout and a tarball that `docker load` reads.
//
// Every file and the config carry the Unix epoch as their time, so the
// image's digest depends only on the binary and the version (the tag is
// not part of the image): the same commit and VERSION give the same digest.
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The nonroot user of gcr.io/distroless/static:nonroot, which the Dockerfile
// runs as. Numeric in the config: the kubelet can only check runAsNonRoot
// against a numeric user.
const (
	nonrootID   = 65532
	nonrootUser = "65532:65532"
)

// The files distroless/static:nonroot has that the manager's user relies on.
// The CA bundle and time zones are not copied: the manager trusts the
// cluster's CA from its service account and Redis's from --redis-ca-file or
// the Mozilla roots compiled into it, and logs in UTC.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
)

// goarch maps an ELF machine to the image platform's architecture, for the
// platforms kubebuilder builds images for.
var goarch = map[elf.Machine]string{
	elf.EM_X86_64:  "amd64",
	elf.EM_AARCH64: "arm64",
	elf.EM_PPC64:   "ppc64le",
	elf.EM_S390:    "s390x",
}

func main() {
	var binary, version, tag, ociDir, tarFile string
	flag.StringVar(&binary, "binary", "", "the static linux manager binary to put at /manager")
	flag.StringVar(&version, "version", "", "the manager's version, for the org.opencontainers.image.version label")
	flag.StringVar(&tag, "tag", "", "the image reference, e.g. registry.example/lockwarden/manager:v1.0.0")
	flag.StringVar(&ociDir, "oci", "", "directory to write the OCI image layout to (replaced)")
	flag.StringVar(&tarFile, "tar", "", "file to write the docker-load tarball to (replaced)")
	flag.Parse()
	if binary == "" || version == "" || tag == "" || ociDir == "" || tarFile == "" {
		fmt.Fprintln(os.Stderr, "image: -binary, -version, -tag, -oci and -tar are required")
		os.Exit(2)
	}
	if err := run(binary, version, tag, ociDir, tarFile); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(binary, version, tag, ociDir, tarFile string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return err
	}
	arch, err := staticLinuxArch(binary)
	if err != nil {
		return err
	}
	manager, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	img, err := build(manager, version, arch)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}

	if err := os.RemoveAll(ociDir); err != nil {
		return err
	}
	oci, err := layout.Write(ociDir, empty.Index)
	if err != nil {
		return err
	}
	// ref.name is the tag, as skopeo's oci:DIR:TAG and podman expect;
	// containerd's import reads the full name from its own annotation.
	if err := oci.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.TagStr(),
		"io.containerd.image.name":          ref.Name(),
	})); err != nil {
		return err
	}
	if err := tarball.WriteToFile(tarFile, ref, img); err != nil {
		return err
	}
	fmt.Printf("image %s (%s, linux/%s): OCI layout %s, tarball %s\n", ref.Name(), digest, arch, ociDir, tarFile)
	return nil
}

// staticLinuxArch refuses a binary that would not run on an empty base
// (dynamically linked, or not built for Linux) and returns its architecture.
func staticLinuxArch(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s is not a Linux executable: %w", path, err)
	}
	defer f.Close()
	if f.OSABI != elf.ELFOSABI_NONE && f.OSABI != elf.ELFOSABI_LINUX {
		return "", fmt.Errorf("%s is built for %v, not Linux", path, f.OSABI)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("%s is dynamically linked; build it with CGO_ENABLED=0 (make manager)", path)
		}
	}
	arch, ok := goarch[f.Machine]
	if f.Machine == elf.EM_PPC64 && f.Data == elf.ELFDATA2MSB {
		arch = "ppc64" // big-endian; the map's entry is the little-endian kind
	}
	if !ok {
		return "", fmt.Errorf("%s is built for %v, which this image builder does not know", path, f.Machine)
	}
	return arch, nil
}

// build makes the image: one layer on an empty base, configured as the
// Dockerfile's final stage.
func build(manager []byte, version, arch string) (v1.Image, error) {
	files, err := rootfs(manager)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(files)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "make image", Comment: "the lockwarden manager on an empty base"},
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
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.Entrypoint = []string{"/manager"}
	cfg.Config.User = nonrootUser
	cfg.Config.WorkingDir = "/"
	cfg.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   "lockwarden-manager",
		"org.opencontainers.image.version": version,
	}
	return mutate.ConfigFile(img, cfg)
}

// epoch is every timestamp in the image.
var epoch = time.Unix(0, 0).UTC()

// rootfs returns the layer's tar: the directories, /etc/passwd and
// /etc/group naming the nonroot user, its home, and /manager.
func rootfs(manager []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []struct {
		name     string
		mode     int64
		uid      int
		contents []byte // nil for a directory
	}{
		{"etc/", 0o755, 0, nil},
		{"etc/passwd", 0o644, 0, []byte(passwd)},
		{"etc/group", 0o644, 0, []byte(group)},
		{"home/", 0o755, 0, nil},
		{"home/nonroot/", 0o700, nonrootID, nil},
		{"tmp/", 0o1777, 0, nil},
		{"manager", 0o755, 0, manager},
	}
	for _, e := range entries {
		hdr := &tar.Header{
			Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: epoch,
			Typeflag: tar.TypeReg, Size: int64(len(e.contents)),
		}
		if e.contents == nil {
			hdr.Typeflag = tar.TypeDir
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.contents); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
