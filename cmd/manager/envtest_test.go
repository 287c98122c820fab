package main

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/envtestassets"
)

// One API server (envtest, with the CRD) for the package's tests that need
// one, started by the first of them and stopped by TestMain.
var (
	envOnce   sync.Once
	envCfg    *rest.Config
	envErr    error
	envStop   = func() {}
	envScheme = runtime.NewScheme()
)

// apiServer returns the shared API server's administrator configuration
// and a client for it.
func apiServer(t *testing.T) (*rest.Config, client.Client) {
	t.Helper()
	envOnce.Do(func() {
		for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, locksv1.AddToScheme} {
			if envErr = add(envScheme); envErr != nil {
				return
			}
		}
		root, err := filepath.Abs(filepath.Join("..", ".."))
		if err != nil {
			envErr = err
			return
		}
		env := &envtest.Environment{
			CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
			ErrorIfCRDPathMissing: true,
		}
		if env.BinaryAssetsDirectory, envErr = envtestassets.Dir(context.Background(), root, os.Stderr); envErr != nil {
			return
		}
		if envCfg, envErr = env.Start(); envErr != nil {
			return
		}
		envStop = func() { _ = env.Stop() }
	})
	if envErr != nil {
		t.Fatal(envErr)
	}
	c, err := client.New(envCfg, client.Options{Scheme: envScheme})
	if err != nil {
		t.Fatal(err)
	}
	return envCfg, c
}
