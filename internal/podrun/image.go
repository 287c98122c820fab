// Package podrun runs a container of a Kubernetes pod on this machine as the
// kubelet would, from an image unpacked here, for the tests on a control
// plane whose nodes (kwok) pretend to run pods: the image's files chrooted
// into, as the image's user in a user namespace of its own (no root needed),
// with the pod's command, arguments, environment, Secret and ConfigMap
// volumes and service account token.
//
// What it does not resolve (another volume kind, an environment source it
// does not know) fails the test, never is skipped.
package podrun

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Image is an image's files, unpacked under Rootfs, and the part of its
// config a container runtime runs it by.
type Image struct {
	Rootfs string
	Config ImageConfig
}

// ImageConfig is the "config" of an OCI image config.
type ImageConfig struct {
	Entrypoint []string          `json:"Entrypoint"`
	Cmd        []string          `json:"Cmd"`
	Env        []string          `json:"Env"`
	User       string            `json:"User"`
	WorkingDir string            `json:"WorkingDir"`
	Labels     map[string]string `json:"Labels"`
}

// UnpackLayer extracts a gzipped layer under rootfs, checking the
// uncompressed tar against diffID, and returns the tar's headers by path in
// the image ("/manager"). It knows directories and regular files; any other
// entry, or a path that is not clean, is an error.
func UnpackLayer(blob []byte, diffID, rootfs string) (map[string]*tar.Header, error) {
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		return nil, err
	}
	hash := sha256.New()
	tee := io.TeeReader(zr, hash)
	tr := tar.NewReader(tee)
	headers := map[string]*tar.Header{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		name := path.Clean("/" + hdr.Name)
		if name != "/"+strings.TrimSuffix(hdr.Name, "/") {
			return nil, fmt.Errorf("entry %q is not a clean relative path", hdr.Name)
		}
		headers[name] = hdr
		target := filepath.Join(rootfs, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return nil, err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return nil, err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return nil, err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("entry %q has type %q, which podrun does not unpack", hdr.Name, hdr.Typeflag)
		}
		mode := hdr.FileInfo().Mode()
		if err := os.Chmod(target, mode.Perm()|mode&(os.ModeSticky|os.ModeSetuid|os.ModeSetgid)); err != nil {
			return nil, err
		}
	}
	// The tar's end-of-archive padding is part of the diff_id.
	if _, err := io.Copy(io.Discard, tee); err != nil {
		return nil, err
	}
	if got := "sha256:" + hex.EncodeToString(hash.Sum(nil)); got != diffID {
		return nil, fmt.Errorf("uncompressed layer is %s, diff_id says %s", got, diffID)
	}
	return headers, nil
}

// UIDGID is the config's User, which must be numeric, uid:gid: the kubelet
// enforces runAsNonRoot only for a numeric user, and refuses to start a
// container whose user is a name.
func (img *Image) UIDGID(t testing.TB) (uid, gid int) {
	t.Helper()
	u, g, ok := strings.Cut(img.Config.User, ":")
	var err1, err2 error
	uid, err1 = strconv.Atoi(u)
	gid, err2 = strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("image user %q is not numeric uid:gid", img.Config.User)
	}
	return uid, gid
}

// Copy returns the image with a copy of its files of its own, so that the
// files written for one container (its token, its Secrets) are not
// another's: directories copied, files hard-linked where the file system
// allows it.
func (img *Image) Copy(t testing.TB) *Image {
	t.Helper()
	c := *img
	c.Rootfs = filepath.Join(t.TempDir(), "rootfs")
	if _, err := exec.Command("cp", "-al", img.Rootfs, c.Rootfs).CombinedOutput(); err != nil {
		_ = os.RemoveAll(c.Rootfs)
		if out, err := exec.Command("cp", "-a", img.Rootfs, c.Rootfs).CombinedOutput(); err != nil {
			t.Fatalf("copying the image's files: %v\n%s", err, out)
		}
	}
	// The copy must be the image's user's to write into, as the original.
	if err := os.Chmod(c.Rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	return &c
}

// Command is the image's process as a container runtime starts it, with a
// pod's command and args (either may be empty), by Kubernetes' rules: a
// command replaces the entrypoint and the image's Cmd, args replace the
// Cmd. It runs chrooted into the image's files, in its working directory,
// as its user (a user namespace maps that user to ours, so files we own are
// its own inside), with its environment and then env. Nothing of the
// host's file system is visible, not even /proc, which a runtime would
// mount.
func (img *Image) Command(t testing.TB, env, command, args []string) *exec.Cmd {
	t.Helper()
	uid, gid := img.UIDGID(t)
	argv := img.Config.Entrypoint
	switch {
	case len(command) > 0:
		argv = slices.Concat(command, args)
	case len(args) > 0:
		argv = slices.Concat(argv, args)
	default:
		argv = slices.Concat(argv, img.Config.Cmd)
	}
	if len(argv) == 0 {
		t.Fatal("nothing to run: the image has no entrypoint")
	}
	// An absolute path is not looked up on the host: the chroot makes it
	// the image's.
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = img.Config.WorkingDir
	if cmd.Dir == "" {
		cmd.Dir = "/" // a runtime's default: never a directory of the host
	}
	cmd.Env = slices.Concat(img.Config.Env, env)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:      img.Rootfs,
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: os.Geteuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: gid, HostID: os.Getegid(), Size: 1}},
		Setpgid:     true,
		Pdeathsig:   syscall.SIGKILL,
	}
	return cmd
}

// Output runs the image with the command and args to its end, within
// timeout, and returns its output (stdout and stderr) and exit code.
func (img *Image) Output(t testing.TB, timeout time.Duration, command, args []string) (string, int) {
	t.Helper()
	cmd := img.Command(t, nil, command, args)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	code := Run(t, cmd, timeout, &out)
	return out.String(), code
}

// Run starts cmd and waits for it to exit within timeout, returning its
// exit code; out is cmd's output, shown if it does not exit.
func Run(t testing.TB, cmd *exec.Cmd, timeout time.Duration, out fmt.Stringer) int {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %v: %v", cmd.Args, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not exit within %v:\n%s", cmd.Args, timeout, out)
	}
	return cmd.ProcessState.ExitCode()
}
