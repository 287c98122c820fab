// Command krew writes the krew plugin manifest (lockwarden.yaml) of a
// release from lockwarden.yaml.tmpl: per archive
// kubectl-lockwarden_<os>_<arch>.tar.gz given, a platform whose URL is
// -url-base/<archive>, with the archive's SHA-256 and the files it holds.
// The plugin's binary, kubectl-lockwarden, must be one of them.
//
//	krew -version v0.2.0 -homepage https://github.com/lockwarden/lockwarden \
//	  -url-base https://github.com/lockwarden/lockwarden/releases/download/v0.2.0 \
//	  -o lockwarden.yaml kubectl-lockwarden_*.tar.gz
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/template"

	"gopkg.in/yaml.v3"
)

//go:embed lockwarden.yaml.tmpl
var manifestTemplate string

// bin is the plugin's executable in every archive: kubectl runs
// kubectl-lockwarden for `kubectl lockwarden`.
const bin = "kubectl-lockwarden"

// archiveName is the name every archive must have; krew's platforms are
// the os and arch in it.
var archiveName = regexp.MustCompile(`^kubectl-lockwarden_(linux|darwin|windows)_(amd64|arm64|arm|386|ppc64le|s390x)\.tar\.gz$`)

// semver is krew's rule for spec.version: a semantic version with the v.
var semver = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

type platform struct {
	OS, Arch, URI, SHA256, Bin string
	Files                      []string
}

func main() {
	version := flag.String("version", "", "the release's version, vX.Y.Z")
	homepage := flag.String("homepage", "", "the plugin's home page")
	base := flag.String("url-base", "", "the URL the archives are downloaded from, without the file name")
	out := flag.String("o", "", "the manifest to write (its name must be lockwarden.yaml)")
	flag.Parse()
	if err := run(*version, *homepage, *base, *out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "krew:", err)
		os.Exit(1)
	}
}

func run(version, homepage, base, out string, archives []string) error {
	switch {
	case !semver.MatchString(version):
		return fmt.Errorf("-version %q is not vMAJOR.MINOR.PATCH", version)
	case homepage == "" || base == "" || out == "" || len(archives) == 0:
		return fmt.Errorf("usage: krew -version V -homepage URL -url-base URL -o lockwarden.yaml ARCHIVE...")
	case filepath.Base(out) != "lockwarden.yaml":
		return fmt.Errorf("-o %s: krew requires the manifest's file name to be the plugin's name, lockwarden.yaml", out)
	}
	if u, err := url.Parse(base); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("-url-base %q is not an http(s) URL", base)
	}
	var platforms []platform
	seen := map[string]bool{}
	for _, a := range archives {
		name := filepath.Base(a)
		m := archiveName.FindStringSubmatch(name)
		if m == nil {
			return fmt.Errorf("%s is not named kubectl-lockwarden_<os>_<arch>.tar.gz", a)
		}
		if seen[m[1]+"/"+m[2]] {
			return fmt.Errorf("two archives for %s/%s", m[1], m[2])
		}
		seen[m[1]+"/"+m[2]] = true
		data, err := os.ReadFile(a)
		if err != nil {
			return err
		}
		files, err := tgzNames(data)
		if err != nil {
			return fmt.Errorf("%s: %w", a, err)
		}
		exe := bin
		if m[1] == "windows" {
			exe += ".exe"
		}
		if !slices.Contains(files, exe) {
			return fmt.Errorf("%s does not hold %s (it holds %v)", a, exe, files)
		}
		sum := sha256.Sum256(data)
		platforms = append(platforms, platform{
			OS: m[1], Arch: m[2], URI: strings.TrimSuffix(base, "/") + "/" + name,
			SHA256: hex.EncodeToString(sum[:]), Bin: exe, Files: files,
		})
	}
	var buf bytes.Buffer
	tmpl := template.Must(template.New("manifest").Parse(manifestTemplate))
	if err := tmpl.Execute(&buf, map[string]any{"Version": version, "Homepage": homepage, "Platforms": platforms}); err != nil {
		return err
	}
	// What was rendered must read back as the same manifest: the template
	// quotes nothing, so a value YAML reads otherwise would show here.
	var back struct {
		Spec struct {
			Version   string
			Platforms []struct {
				URI, SHA256 string
			}
		}
	}
	if err := yaml.Unmarshal(buf.Bytes(), &back); err != nil {
		return fmt.Errorf("the rendered manifest is not YAML: %w", err)
	}
	if back.Spec.Version != version || len(back.Spec.Platforms) != len(platforms) {
		return fmt.Errorf("the rendered manifest reads back as version %q with %d platforms", back.Spec.Version, len(back.Spec.Platforms))
	}
	for i, p := range back.Spec.Platforms {
		if p.URI != platforms[i].URI || p.SHA256 != platforms[i].SHA256 {
			return fmt.Errorf("the rendered manifest reads back platform %d as %+v", i, p)
		}
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

// tgzNames lists the regular files of a .tar.gz, in its order.
func tgzNames(data []byte) ([]string, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return names, nil
		}
		if err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			names = append(names, strings.TrimPrefix(hdr.Name, "./"))
		}
	}
}
