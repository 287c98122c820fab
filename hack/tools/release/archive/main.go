// Command archive writes a .tar.gz of the files it is given, each at the
// top of the archive under its base name (or NAME=FILE's NAME), so that it
// depends on their contents alone: every entry has one time (-mtime,
// SOURCE_DATE_EPOCH), owner root, no user or group names, and the gzip
// header carries no time or file name. `make release` packs the CLI this
// way for krew and for a download:
//
//	archive -mtime 1700000000 -o kubectl-lockwarden_linux_amd64.tar.gz kubectl-lockwarden=dist/.../lockwarden-linux-amd64 LICENSE
//
// A file that is executable for its owner is archived with mode 0755, any
// other with 0644.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	mtime := flag.Int64("mtime", 0, "the time of every entry, in seconds since the Unix epoch")
	out := flag.String("o", "", "the archive to write (replaced)")
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: archive -mtime SECONDS -o OUT.tar.gz [NAME=]FILE...")
		os.Exit(2)
	}
	if err := write(*out, time.Unix(*mtime, 0).UTC(), flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "archive:", err)
		os.Exit(1)
	}
}

func write(out string, mtime time.Time, args []string) error {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	seen := map[string]bool{}
	for _, arg := range args {
		name, file, ok := strings.Cut(arg, "=")
		if !ok {
			name, file = filepath.Base(arg), arg
		}
		if name == "" || strings.ContainsAny(name, "/\\") || name == "." || name == ".." {
			return fmt.Errorf("%q: the name in the archive must be a plain file name", arg)
		}
		if seen[name] {
			return fmt.Errorf("two files named %s", name)
		}
		seen[name] = true
		info, err := os.Stat(file)
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", file)
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		mode := int64(0o644)
		if info.Mode().Perm()&0o100 != 0 {
			mode = 0o755
		}
		hdr := &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}
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
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}
