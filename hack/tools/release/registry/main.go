// Command registry serves an OCI registry on a loopback port, over TLS, for
// test/release to publish a release to and install it from: it is
// go-containerregistry's registry (pkg/registry), with the referrers API
// on, keeping blobs in -dir. Its certificate is made at start for
// 127.0.0.1 and written, PEM, to -ca-file, for clients to trust (Go
// programs with SSL_CERT_FILE, helm with --ca-file). It prints the
// address it serves, host:port, as its first line, and serves until it is
// killed or its standard input closes.
package main

import (
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	dir := flag.String("dir", "", "directory to keep the blobs in")
	caFile := flag.String("ca-file", "", "file to write the server's certificate to, PEM")
	verbose := flag.Bool("v", false, "log every request to standard error")
	flag.Parse()
	if *dir == "" || *caFile == "" {
		fmt.Fprintln(os.Stderr, "usage: registry -dir DIR -ca-file FILE [-v]")
		os.Exit(2)
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "registry:", err)
		os.Exit(1)
	}
	logger := log.New(io.Discard, "", 0)
	if *verbose {
		logger = log.New(os.Stderr, "registry: ", log.LstdFlags)
	}
	// httptest's server: a certificate for 127.0.0.1, ::1 and example.com,
	// on a free loopback port.
	srv := httptest.NewTLSServer(registry.New(
		registry.Logger(logger),
		registry.WithReferrersSupport(true),
		registry.WithBlobHandler(registry.NewDiskBlobHandler(*dir)),
	))
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(*caFile, ca, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "registry:", err)
		os.Exit(1)
	}
	fmt.Println(srv.Listener.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
}
