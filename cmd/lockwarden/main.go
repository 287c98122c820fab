// Command lockwarden runs a command while holding a lockwarden Redis lock,
// for jobs, such as CronJobs, that take the lock themselves instead of
// waiting behind a DistributedLock's scheduling gate, explains why a pod
// waits behind one, and frees gated pods:
//
//	lockwarden run --lock NAME -- CMD [ARG...]
//	lockwarden why POD [-n NAMESPACE] [-o json|yaml]
//	lockwarden free (-n NAMESPACE | -A) [--dry-run]
//	lockwarden version
//	lockwarden completion bash|zsh|fish
//
// Installed as kubectl-lockwarden it is a kubectl plugin: kubectl
// lockwarden why POD -n NAMESPACE. The commands that talk to the API server
// take kubectl's flags (--kubeconfig, --context, -n ...) anywhere on the
// line. `lockwarden --help` lists the commands, `lockwarden COMMAND --help`
// documents each.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// version is the CLI's version, set at build time by the Makefile with
// -ldflags "-X main.version=..."; a plain `go build` leaves "dev".
var version = "dev"

func main() {
	os.Exit(execute(os.Args[0], os.Args[1:], genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}))
}

// execute runs the command line args of the binary argv0 and returns the
// exit status.
func execute(argv0 string, args []string, streams genericiooptions.IOStreams) int {
	root := newRoot(commandName(argv0), streams)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	var code exitCode
	var usage usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return int(code)
	case errors.As(err, &usage):
		fmt.Fprintf(streams.ErrOut, "%s: %v\n", cmd.CommandPath(), err)
		if cmd == root {
			fmt.Fprint(streams.ErrOut, synopsis(root.DisplayName()))
		}
		fmt.Fprintf(streams.ErrOut, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitUsage
	default:
		fmt.Fprintf(streams.ErrOut, "%s: %v\n", cmd.CommandPath(), err)
		return exitUnavailable
	}
}

// commandName is the name the binary goes by: "kubectl lockwarden" when it
// is installed as the kubectl plugin kubectl-lockwarden (kubectl runs
// kubectl-NAME for `kubectl NAME`), else "lockwarden".
func commandName(argv0 string) string {
	base := strings.TrimSuffix(filepath.Base(argv0), ".exe")
	if plugin, ok := strings.CutPrefix(base, "kubectl-"); ok && plugin != "" {
		return "kubectl " + plugin
	}
	return "lockwarden"
}

// exitCode ends lockwarden with that status and no message: the command
// has said what happened (run exits with CMD's status).
type exitCode int

func (s exitCode) Error() string { return fmt.Sprintf("exit status %d", int(s)) }

// usageError is a command line lockwarden cannot run: exit status 2, with a
// pointer to the command's help.
type usageError struct{ error }

func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// newRoot returns the root command, called name ("lockwarden" or
// "kubectl lockwarden"), with every subcommand.
func newRoot(name string, streams genericiooptions.IOStreams) *cobra.Command {
	root := &cobra.Command{
		// Use is the binary's name, which completion scripts complete;
		// help and errors show the display name.
		Use:   strings.ReplaceAll(name, " ", "-"),
		Short: "Distributed locks on Redis for Kubernetes: guard a job, explain a waiting pod, free gated pods",
		Long: `lockwarden's command line, for the DistributedLock resource and its Redis locks:
run guards a command in a job's container with a Redis lock; why explains
why a pod waits behind lockwarden's scheduling gates; free lifts those gates
(after uninstalling lockwarden).

why and free read the cluster as kubectl does: --kubeconfig, --context,
-n/--namespace and kubectl's other flags work anywhere on the line. run reads
Redis and its pod from the environment instead (see '` + name + ` run --help').

Exit status:
  0    done
  2    bad usage
  69   the API server, the kubeconfig, the environment or Redis failed
  run exits with CMD's status, or with its own (see '` + name + ` run --help').`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: name},
		Version:       version,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			msg := fmt.Sprintf("unknown command %q", args[0])
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return usageError{errors.New(msg)}
		},
		RunE: func(*cobra.Command, []string) error { return usageErrorf("give a command") },
		CompletionOptions: cobra.CompletionOptions{
			// The completion command below replaces cobra's, to say how to
			// install the script for the name the binary goes by.
			DisableDefaultCmd: true,
		},
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	root.SetVersionTemplate("{{.Version}}\n")
	// Cobra's --version flag, declared here so that it has no -v.
	root.Flags().Bool("version", false, "print the version and exit")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })

	// The root runs only to report a missing command, so its help shows
	// no "lockwarden [flags]" line; the subcommands' show theirs.
	const runnableLine = "{{if .Runnable}}\n  {{.UseLine}}{{end}}"
	if !strings.Contains(root.UsageTemplate(), runnableLine) {
		panic("cobra's usage template changed: no " + runnableLine)
	}
	root.SetUsageTemplate(strings.Replace(root.UsageTemplate(), runnableLine, "{{if and .Runnable .HasParent}}\n  {{.UseLine}}{{end}}", 1))

	kube := genericclioptions.NewConfigFlags(true)
	kube.AddFlags(root.PersistentFlags())
	registerKubeCompletions(root, kube)

	root.AddCommand(
		newRunCmd(name, streams),
		newWhyCmd(name, kube, streams),
		newFreeCmd(name, kube, streams),
		newVersionCmd(name, streams),
		newCompletionCmd(name, streams),
	)
	return root
}

// synopsis is the commands' usage lines, printed after a usage error of the
// root.
func synopsis(name string) string {
	pad := strings.Repeat(" ", len("Usage: "))
	return "Usage: " + name + " run (--lock NAME | --lock-resource NAME) [flags] -- CMD [ARG...]\n" +
		pad + name + " why POD [-n NAMESPACE] [-o json|yaml]\n" +
		pad + name + " free (-n NAMESPACE | -A) [--dry-run] [-o json|yaml|name]\n" +
		pad + name + " version\n" +
		pad + name + " completion bash|zsh|fish\n"
}

// exactArgs requires n arguments, else says what to give.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usageErrorf("%s", what)
		}
		return nil
	}
}
