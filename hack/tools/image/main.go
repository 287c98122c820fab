// Command image builds the manager's container image for `make image`, with
// no docker daemon and no network: no base image is pulled, so the image is
// one layer on an empty base, holding what the Dockerfile's image needs from
// gcr.io/distroless/static:nonroot (the static manager, the nonroot user,
// /tmp) and configured as the Dockerfile configures it. It writes an OCI
// image layout and a tarball that `docker load` reads.
//
// With -command lockwarden it builds the CLI's image of `make release` the
// same way: /lockwarden instead of /manager, for job images to copy
// (`COPY --from=...lockwarden-cli:VERSION /lockwarden /usr/local/bin/`).
//
// Given a binary per architecture (-binary repeated; each one's
// architecture is read from its ELF header), it builds one image per
// architecture and writes their multi-arch OCI image index instead (no
// docker tarball, which holds one platform), and optionally the layout as
// one tar file (-oci-archive, for `skopeo copy oci-archive:...`).
//
// Every file and the config carry one time, -created (by default the Unix
// epoch; `make release` passes the commit's time), so the image's digest
// depends only on the binaries, the version, the labels and that time (the
// tag is not part of the image): the same commit and VERSION give the same
// digest.
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
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

// labels are the image's labels, the Dockerfile's too.
type labels struct{ version, source, revision string }

func main() {
	var binaries []string
	var version, tag, ociDir, tarFile, archive, digestFile string
	var lb labels
	var created int64
	flag.StringVar(&command, "command", command, "the image's one program: the binary's name at / and the entrypoint, and lockwarden-COMMAND its title")
	flag.Func("binary", "a static linux binary to put at /COMMAND; repeat it, one per architecture, for a multi-arch index", func(s string) error {
		binaries = append(binaries, s)
		return nil
	})
	flag.StringVar(&version, "version", "", "the binary's version, for the org.opencontainers.image.version label")
	flag.StringVar(&lb.source, "source", "", "the source repository's URL, for the org.opencontainers.image.source label")
	flag.StringVar(&lb.revision, "revision", "", "the source's commit, for the org.opencontainers.image.revision label")
	flag.Int64Var(&created, "created", 0, "the time of every file and of the image, in seconds since the Unix epoch (SOURCE_DATE_EPOCH)")
	flag.StringVar(&tag, "tag", "", "the image reference, e.g. registry.example/lockwarden/manager:v1.0.0")
	flag.StringVar(&ociDir, "oci", "", "directory to write the OCI image layout to (replaced)")
	flag.StringVar(&tarFile, "tar", "", "file to write the docker-load tarball to (replaced; one binary only)")
	flag.StringVar(&archive, "oci-archive", "", "file to write the OCI image layout to as a tar archive (replaced)")
	flag.StringVar(&digestFile, "digest-file", "", "file to write the image's (or the index's) digest to")
	flag.Parse()
	lb.version = version
	if len(binaries) == 0 || version == "" || tag == "" || ociDir == "" || (tarFile == "" && len(binaries) == 1) {
		fmt.Fprintln(os.Stderr, "image: -binary, -version, -tag, -oci and, for one binary, -tar are required")
		os.Exit(2)
	}
	if command == "" || strings.ContainsAny(command, "/.") {
		fmt.Fprintf(os.Stderr, "image: -command %q must be a plain file name\n", command)
		os.Exit(2)
	}
	if tarFile != "" && len(binaries) > 1 {
		fmt.Fprintln(os.Stderr, "image: -tar holds one platform; drop it with several binaries")
		os.Exit(2)
	}
	epoch = time.Unix(created, 0).UTC()
	if err := run(binaries, lb, tag, ociDir, tarFile, archive, digestFile); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(binaries []string, lb labels, tag, ociDir, tarFile, archive, digestFile string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return err
	}
	var images []v1.Image
	var archs []string
	for _, binary := range binaries {
		arch, err := staticLinuxArch(binary)
		if err != nil {
			return err
		}
		if slices.Contains(archs, arch) {
			return fmt.Errorf("two binaries for linux/%s", arch)
		}
		program, err := os.ReadFile(binary)
		if err != nil {
			return err
		}
		img, err := build(program, lb, arch)
		if err != nil {
			return err
		}
		images, archs = append(images, img), append(archs, arch)
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
	annotations := layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.TagStr(),
		"io.containerd.image.name":          ref.Name(),
	})
	var digest v1.Hash
	if len(images) == 1 {
		if digest, err = images[0].Digest(); err != nil {
			return err
		}
		if err := oci.AppendImage(images[0], annotations); err != nil {
			return err
		}
	} else {
		idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
		for i, img := range images {
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
				Add:        img,
				Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: archs[i]}},
			})
		}
		if digest, err = idx.Digest(); err != nil {
			return err
		}
		if err := oci.AppendIndex(idx, annotations); err != nil {
			return err
		}
	}
	if tarFile != "" {
		if err := tarball.WriteToFile(tarFile, ref, images[0]); err != nil {
			return err
		}
	}
	if archive != "" {
		if err := tarDir(ociDir, archive); err != nil {
			return err
		}
	}
	if digestFile != "" {
		if err := os.WriteFile(digestFile, []byte(digest.String()+"\n"), 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("image %s (%s, linux/%v): OCI layout %s\n", ref.Name(), digest, archs, ociDir)
	return nil
}

// tarDir writes dir's files to a tar archive, in name order, each with the
// image's time, owned by root, so the same layout gives the same archive.
func tarDir(dir, file string) error {
	var paths []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && path != dir {
			paths = append(paths, path)
		}
		return err
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, path := range paths {
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: epoch, Typeflag: tar.TypeReg}
		var data []byte
		if info.IsDir() {
			hdr.Name, hdr.Mode, hdr.Typeflag = hdr.Name+"/", 0o755, tar.TypeDir
		} else if data, err = os.ReadFile(path); err != nil {
			return err
		}
		hdr.Size = int64(len(data))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(file, buf.Bytes(), 0o644)
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
func build(program []byte, lb labels, arch string) (v1.Image, error) {
	files, err := rootfs(program)
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
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "make image", Comment: "the lockwarden " + command + " on an empty base"},
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
	cfg.Config.Entrypoint = []string{"/" + command}
	cfg.Config.User = nonrootUser
	cfg.Config.WorkingDir = "/"
	cfg.Config.Labels = map[string]string{
		"org.opencontainers.image.title":    "lockwarden-" + command,
		"org.opencontainers.image.version":  lb.version,
		"org.opencontainers.image.licenses": license,
	}
	if lb.source != "" {
		cfg.Config.Labels["org.opencontainers.image.source"] = lb.source
	}
	if lb.revision != "" {
		cfg.Config.Labels["org.opencontainers.image.revision"] = lb.revision
	}
	return mutate.ConfigFile(img, cfg)
}

// license is the project's license (LICENSE), as an SPDX expression for
// the org.opencontainers.image.licenses label; the Dockerfile sets the same.
const license = "Apache-2.0"

// epoch is every timestamp in the image: -created.
var epoch = time.Unix(0, 0).UTC()

// command is the image's one program, /command: -command.
var command = "manager"

// rootfs returns the layer's tar: the directories, /etc/passwd and
// /etc/group naming the nonroot user, its home, and /COMMAND.
func rootfs(program []byte) ([]byte, error) {
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
		{command, 0o755, 0, program},
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
