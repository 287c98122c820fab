// Command normtgz rewrites a .tgz (a packaged Helm chart) so that it
// depends on its files alone: every entry gets the same time (-mtime,
// SOURCE_DATE_EPOCH), owner root and no user or group names, and the gzip
// header carries no time or file name. `helm package` stamps the time of
// packaging, so two packagings of one chart would otherwise differ.
//
//	normtgz -mtime 1700000000 dist/release/v0.2.0/lockwarden-0.2.0.tgz
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

func main() {
	mtime := flag.Int64("mtime", 0, "the time of every entry, in seconds since the Unix epoch")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: normtgz -mtime SECONDS FILE.tgz")
		os.Exit(2)
	}
	if err := normalize(flag.Arg(0), time.Unix(*mtime, 0).UTC()); err != nil {
		fmt.Fprintln(os.Stderr, "normtgz:", err)
		os.Exit(1)
	}
}

func normalize(file string, mtime time.Time) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	var out bytes.Buffer
	zw, err := gzip.NewWriterLevel(&out, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		clean := &tar.Header{
			Name: hdr.Name, Typeflag: hdr.Typeflag, Mode: hdr.Mode &^ 0o022, Size: hdr.Size,
			ModTime: mtime, Format: tar.FormatPAX,
		}
		if clean.Typeflag == tar.TypeReg || clean.Typeflag == tar.TypeRegA {
			clean.Typeflag, clean.Mode = tar.TypeReg, 0o644
		}
		if err := tw.WriteHeader(clean); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(file, out.Bytes(), 0o644)
}
