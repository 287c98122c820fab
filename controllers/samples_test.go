package controllers_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestSamplesAreAccepted submits every object in config/samples to the real
// API server (as a dry run), so the samples users copy stay valid against
// the CRD's schema and rules, and against the built-in kinds.
func TestSamplesAreAccepted(t *testing.T) {
	ns := newNamespace(t)
	files, err := filepath.Glob(filepath.Join("..", "config", "samples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, file := range files {
		if filepath.Base(file) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		decoder := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			obj := &unstructured.Unstructured{}
			if err := decoder.Decode(&obj.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				t.Fatalf("%s: %v", file, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			obj.SetNamespace(ns)
			if err := k8s.Create(context.Background(), obj, client.DryRunAll); err != nil {
				t.Errorf("%s: %s %s refused: %v", file, obj.GetKind(), obj.GetName(), err)
			}
			seen++
		}
	}
	if seen < 5 {
		t.Fatalf("only %d sample objects found", seen)
	}
}
