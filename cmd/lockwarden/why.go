package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/why"
)

const whyUsage = `Usage: lockwarden why [-n NAMESPACE] [--kubeconfig FILE] POD

Prints why the pod waits: each lock whose gate it carries, or that it names
or holds, with the lock's key, who holds it, the pod's place in line or what
holds it back, and what is misconfigured; then other controllers' gates. It
reads the pod and the locks' statuses through the kubeconfig's current
context (KUBECONFIG, or ~/.kube/config), as kubectl does.

Flags (- or --):
`

// whyMain runs `lockwarden why` and returns the exit status.
func whyMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lockwarden why", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	namespace := fs.String("n", "", "the pod's `namespace`; default: the kubeconfig context's")
	kubeconfig := fs.String("kubeconfig", "", "the kubeconfig `file`; default: KUBECONFIG, or ~/.kube/config")
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, whyUsage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return 0
	}
	if err == nil && fs.NArg() != 1 {
		err = errors.New("give one pod name")
	}
	if err != nil {
		fmt.Fprintf(stderr, "lockwarden why: %v\nRun 'lockwarden why --help' for the flags.\n", err)
		return exitUsage
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *kubeconfig
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	if *namespace == "" {
		if *namespace, _, err = loader.Namespace(); err != nil {
			fmt.Fprintf(stderr, "lockwarden why: %v\n", err)
			return exitUnavailable
		}
	}
	cfg, err := loader.ClientConfig()
	if err != nil {
		fmt.Fprintf(stderr, "lockwarden why: %v\n", err)
		return exitUnavailable
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := locksv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintf(stderr, "lockwarden why: %v\n", err)
		return exitUnavailable
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := why.Explain(ctx, c, *namespace, fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "lockwarden why: %v\n", err)
		return exitUnavailable
	}
	fmt.Fprint(stdout, out)
	return 0
}
