package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/why"
)

// reportKind is the apiVersion and kind of `why -o json|yaml`'s object. No
// API server serves it: it is the CLI's output, versioned with the CLI.
var reportKind = schema.GroupVersionKind{Group: "cli.lockwarden.dev", Version: "v1alpha1", Kind: "PodWait"}

// scheme has the kinds the CLI reads and prints.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, locksv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

func newWhyCmd(name string, kube *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams) *cobra.Command {
	print := genericclioptions.NewPrintFlags("")
	// A report has no resource name to print.
	print.NamePrintFlags = nil
	cmd := &cobra.Command{
		Use:   "why POD",
		Short: "Explain why a pod waits behind lockwarden's scheduling gates",
		Long: `Prints why the pod waits: each lock whose gate it carries, or that it names
or holds, with the lock's key, who holds it, the pod's place in line or what
holds it back, and what is misconfigured; then other controllers' gates.

It reads the pod and the locks' statuses as kubectl does: the namespace is
-n's, else the kubeconfig context's. -o json or -o yaml prints the same as
an object of kind ` + reportKind.Kind + ` (apiVersion ` + reportKind.GroupVersion().String() + `), which only
the CLI makes; -o jsonpath=... picks fields from it.`,
		Example: `  ` + name + ` why nightly-report-29310-x7k2p -n batch
  ` + name + ` why nightly-report-29310-x7k2p -n batch -o json
  ` + name + ` why nightly-report-29310-x7k2p --context prod -o jsonpath='{.locks[0].holder.pod}'`,
		Args:              exactArgs(1, "give one pod name"),
		ValidArgsFunction: completePods(kube),
		RunE: func(_ *cobra.Command, args []string) error {
			printer, err := printerFor(print)
			if err != nil {
				return err
			}
			c, ns, err := kubeClient(kube)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			report, err := why.Inspect(ctx, c, ns, args[0])
			if err != nil {
				return err
			}
			if printer == nil {
				_, err := fmt.Fprint(streams.Out, report.String())
				return err
			}
			fields, err := runtime.DefaultUnstructuredConverter.ToUnstructured(report)
			if err != nil {
				return err
			}
			obj := &unstructured.Unstructured{Object: fields}
			obj.SetGroupVersionKind(reportKind)
			return printer.PrintObj(obj, streams.Out)
		},
	}
	print.AddFlags(cmd)
	return cmd
}

func newFreeCmd(name string, kube *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams) *cobra.Command {
	var all, dryRun bool
	print := genericclioptions.NewPrintFlags("")
	cmd := &cobra.Command{
		Use:   "free (-n NAMESPACE | -A)",
		Short: "Lift lockwarden's scheduling gates from every pod of a namespace",
		Long: `Lifts lockwarden's scheduling gates (gate.lockwarden.dev/...) from every pod
of the namespace, or of every namespace with -A, on purpose: after
lockwarden is uninstalled its gated pods would wait for ever. They then start
without holding any lock. Other controllers' gates are kept. It prints each
pod it freed and the gates it lifted; -o json|yaml prints the pods as the API
server returned them, -o name their names.

--dry-run has the API server check each change and answer it without storing
it (a server-side dry run): it prints what it would free, and changes
nothing, in the cluster or in Redis. Give -n explicitly: the kubeconfig
context's namespace is not enough for this.`,
		Example: `  ` + name + ` free -n batch --dry-run
  ` + name + ` free -n batch
  ` + name + ` free -A -o name`,
		Args: exactArgs(0, "give -n NAMESPACE or -A, and no argument"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (*kube.Namespace == "") == !all {
				return usageErrorf("give -n NAMESPACE or -A")
			}
			printer, err := printerFor(print)
			if err != nil {
				return err
			}
			c, _, err := kubeClient(kube)
			if err != nil {
				return err
			}
			ns := *kube.Namespace
			if all {
				ns = ""
			}
			var opts []client.PatchOption
			if dryRun {
				opts = append(opts, client.DryRunAll)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			lifted, liftErr := why.Lift(ctx, c, ns, opts...)
			if err := printLifted(streams, printer, *print.OutputFormat == "name", lifted, ns, dryRun); err != nil {
				return err
			}
			return liftErr
		},
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "free the pods of every namespace")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be freed, and change nothing (a server-side dry run)")
	print.AddFlags(cmd)
	return cmd
}

// printLifted prints the pods free lifted gates from: with the printer, as
// objects (one by one for -o name, else a List), else one line a pod.
func printLifted(streams genericiooptions.IOStreams, printer printers.ResourcePrinter, byName bool, lifted []why.Lifted, ns string, dryRun bool) error {
	if len(lifted) == 0 {
		where := "in namespace " + ns
		if ns == "" {
			where = "in any namespace"
		}
		fmt.Fprintf(streams.ErrOut, "no pod %s carries a lockwarden gate\n", where)
	}
	if printer == nil {
		for _, l := range lifted {
			pod, gates := l.Pod.Namespace+"/"+l.Pod.Name, strings.Join(l.Gates, ", ")
			if dryRun {
				fmt.Fprintf(streams.Out, "would free %s: would lift %s (dry run)\n", pod, gates)
			} else {
				fmt.Fprintf(streams.Out, "freed %s: lifted %s\n", pod, gates)
			}
		}
		return nil
	}
	list := &corev1.List{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("List"))
	for _, l := range lifted {
		// The client leaves a typed object's kind empty; printers need it.
		l.Pod.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
		if byName {
			if err := printer.PrintObj(l.Pod, streams.Out); err != nil {
				return err
			}
		}
		list.Items = append(list.Items, runtime.RawExtension{Object: l.Pod})
	}
	if byName {
		return nil
	}
	return printer.PrintObj(list, streams.Out)
}

// kubeClient returns a client for the cluster and the namespace kubectl's
// flags pick: -n's, else the kubeconfig context's.
func kubeClient(kube *genericclioptions.ConfigFlags) (client.Client, string, error) {
	ns, _, err := kube.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", err
	}
	cfg, err := kube.ToRESTConfig()
	if err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", err
	}
	return c, ns, nil
}

// printerFor is the printer -o asks for, or nil for the command's own text.
func printerFor(print *genericclioptions.PrintFlags) (printers.ResourcePrinter, error) {
	if *print.OutputFormat == "" {
		return nil, nil
	}
	p, err := print.ToPrinter()
	if err != nil {
		return nil, usageError{err}
	}
	return p, nil
}
