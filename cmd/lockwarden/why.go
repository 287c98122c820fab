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

const freeUsage = `Usage: lockwarden free (-n NAMESPACE | -A) [--kubeconfig FILE]

Lifts lockwarden's scheduling gates (gate.lockwarden.dev/...) from every pod
of the namespace, or of every namespace with -A, on purpose: after
lockwarden is uninstalled its gated pods would wait for ever. They then start
without holding any lock. Other controllers' gates are kept. It prints each
pod it freed.

Flags (- or --):
`

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
	namespace := fs.String("n", "", "the pod's `namespace`; default: the kubeconfig context's")
	kubeconfig := fs.String("kubeconfig", "", "the kubeconfig `file`; default: KUBECONFIG, or ~/.kube/config")
	c, ns, status := kubeClient(fs, whyUsage, args, namespace, kubeconfig, stdout, stderr)
	if c == nil {
		return status
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "lockwarden why: give one pod name\nRun 'lockwarden why --help' for the flags.\n")
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := why.Explain(ctx, c, ns, fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "lockwarden why: %v\n", err)
		return exitUnavailable
	}
	fmt.Fprint(stdout, out)
	return 0
}

// freeMain runs `lockwarden free` and returns the exit status.
func freeMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lockwarden free", flag.ContinueOnError)
	namespace := fs.String("n", "", "the `namespace` whose pods to free")
	all := fs.Bool("A", false, "free the pods of every namespace")
	kubeconfig := fs.String("kubeconfig", "", "the kubeconfig `file`; default: KUBECONFIG, or ~/.kube/config")
	c, ns, status := kubeClient(fs, freeUsage, args, namespace, kubeconfig, stdout, stderr)
	if c == nil {
		return status
	}
	if (*namespace == "") == !*all || fs.NArg() != 0 {
		fmt.Fprintf(stderr, "lockwarden free: give -n NAMESPACE or -A, and nothing else\nRun 'lockwarden free --help' for the flags.\n")
		return exitUsage
	}
	if *all {
		ns = ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	freed, err := why.Free(ctx, c, ns)
	for _, p := range freed {
		fmt.Fprintf(stdout, "freed %s\n", p)
	}
	if err != nil {
		fmt.Fprintf(stderr, "lockwarden free: %v\n", err)
		return exitUnavailable
	}
	return 0
}

// kubeClient parses the flags and returns a client for the kubeconfig's
// current context and the namespace (-n, or the context's), or nil and the
// exit status after --help or an error.
func kubeClient(fs *flag.FlagSet, usage string, args []string, namespace, kubeconfig *string, stdout, stderr io.Writer) (client.Client, string, int) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return nil, "", 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for the flags.\n", fs.Name(), err, fs.Name())
		return nil, "", exitUsage
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *kubeconfig
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	ns := *namespace
	if ns == "" {
		if ns, _, err = loader.Namespace(); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
			return nil, "", exitUnavailable
		}
	}
	cfg, err := loader.ClientConfig()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return nil, "", exitUnavailable
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
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return nil, "", exitUnavailable
	}
	return c, ns, 0
}
