package release

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// The test reads the registry through the OCI distribution API itself,
// with no client library: what it finds there is what a user's tools
// would.

// Media types a manifest request accepts.
const (
	ociIndex    = "application/vnd.oci.image.index.v1+json"
	ociManifest = "application/vnd.oci.image.manifest.v1+json"
)

type ociDescriptor struct {
	MediaType    string            `json:"mediaType"`
	ArtifactType string            `json:"artifactType"`
	Digest       string            `json:"digest"`
	Size         int64             `json:"size"`
	Annotations  map[string]string `json:"annotations"`
	Platform     *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

// ociManifestOrIndex holds either an image manifest or an index.
type ociManifestOrIndex struct {
	MediaType    string            `json:"mediaType"`
	ArtifactType string            `json:"artifactType"`
	Config       ociDescriptor     `json:"config"`
	Layers       []ociDescriptor   `json:"layers"`
	Manifests    []ociDescriptor   `json:"manifests"`
	Subject      *ociDescriptor    `json:"subject"`
	Annotations  map[string]string `json:"annotations"`
}

// fetch GETs a path of the registry's API, returning the body and headers,
// or an error for any status but 200.
func (r *registry) fetch(path string, accept ...string) ([]byte, http.Header, error) {
	req, err := http.NewRequest(http.MethodGet, "https://"+r.host+path, nil)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Accept", strings.Join(accept, ", "))
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	return body, resp.Header, nil
}

// manifest returns repo's manifest or index by tag or digest, and its
// digest, which it checks against the bytes.
func (r *registry) manifest(t *testing.T, repo, ref string) (ociManifestOrIndex, string) {
	t.Helper()
	body, hdr, err := r.fetch("/v2/"+repo+"/manifests/"+ref, ociIndex, ociManifest)
	if err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + sha(body)
	if got := hdr.Get("Docker-Content-Digest"); got != "" && got != digest {
		t.Fatalf("%s:%s: the registry says digest %s of a manifest whose digest is %s", repo, ref, got, digest)
	}
	var m ociManifestOrIndex
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("%s:%s: %v", repo, ref, err)
	}
	return m, digest
}

// blob returns one of repo's blobs, having checked it has its digest.
func (r *registry) blob(t *testing.T, repo, digest string) []byte {
	t.Helper()
	body, _, err := r.fetch("/v2/" + repo + "/blobs/" + digest)
	if err != nil {
		t.Fatal(err)
	}
	if "sha256:"+sha(body) != digest {
		t.Fatalf("%s's blob %s holds other bytes", repo, digest)
	}
	return body
}

// referrers returns the manifests that name digest as their subject.
func (r *registry) referrers(t *testing.T, repo, digest string) []ociDescriptor {
	t.Helper()
	body, _, err := r.fetch("/v2/"+repo+"/referrers/"+digest, ociIndex)
	if err != nil {
		t.Fatal(err)
	}
	var idx ociManifestOrIndex
	if err := json.Unmarshal(body, &idx); err != nil {
		t.Fatal(err)
	}
	return idx.Manifests
}

// downloadServer serves the files of the release artifact in the registry
// (REGISTRY/lockwarden-release:VERSION) by name, at base/NAME, as the
// GitHub release a maintainer uploads them to would.
type downloadServer struct {
	*http.Server
	base string
}

func startDownloads() (*downloadServer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &downloadServer{Server: &http.Server{}, base: "http://" + l.Addr().String() + "/download/" + version}
	s.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		name, ok := strings.CutPrefix(req.URL.Path, "/download/"+version+"/")
		if !ok {
			http.NotFound(w, req)
			return
		}
		body, _, err := reg.fetch("/v2/"+releaseRepo+"/manifests/"+version, ociManifest)
		var m ociManifestOrIndex
		if err == nil {
			err = json.Unmarshal(body, &m)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		for _, l := range m.Layers {
			if l.Annotations["org.opencontainers.image.title"] == name {
				data, _, err := reg.fetch("/v2/" + releaseRepo + "/blobs/" + l.Digest)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadGateway)
					return
				}
				_, _ = w.Write(data)
				return
			}
		}
		http.NotFound(w, req)
	})
	go func() { _ = s.Serve(l) }()
	return s, nil
}

// The repositories the release is published to, under the registry.
const (
	managerRepo = "lockwarden/manager"
	cliRepo     = "lockwarden/lockwarden-cli"
	chartRepo   = "lockwarden/charts/lockwarden"
	releaseRepo = "lockwarden/lockwarden-release"
)

func sha(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
