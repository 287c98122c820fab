package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// versionInfo is what `version -o json|yaml` prints.
type versionInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

func newVersionCmd(name string, streams genericiooptions.IOStreams) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the CLI's version",
		Long: `Prints the version the CLI was built as (the release's tag; "dev" for a plain
go build), as --version does; -o json or -o yaml adds Go's version and the
platform.`,
		Example: `  ` + name + ` version
  ` + name + ` version -o json`,
		Args: exactArgs(0, "version takes no argument"),
		RunE: func(*cobra.Command, []string) error {
			info := versionInfo{Version: version, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
			switch output {
			case "":
				_, err := fmt.Fprintln(streams.Out, version)
				return err
			case "json":
				b, err := json.MarshalIndent(info, "", "    ")
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(streams.Out, "%s\n", b)
				return err
			case "yaml":
				b, err := yaml.Marshal(info)
				if err != nil {
					return err
				}
				_, err = streams.Out.Write(b)
				return err
			}
			return usageErrorf("-o must be json or yaml, not %q", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json or yaml; default: the version alone")
	return cmd
}

func newCompletionCmd(name string, streams genericiooptions.IOStreams) *cobra.Command {
	binary := strings.ReplaceAll(name, " ", "-")
	cmd := &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script",
		Long: `Prints the script that completes ` + binary + `'s commands, flags, pod names,
namespaces and contexts in bash, zsh or fish. Load it in the current shell,
or save it where the shell loads completions from.

As a kubectl plugin, kubectl (1.26 and later) completes 'kubectl lockwarden'
itself through an executable named kubectl_complete-lockwarden on the PATH
that runs 'kubectl-lockwarden __complete "$@"' (see docs/cli.md).`,
		Example: `  source <(` + name + ` completion bash)
  ` + name + ` completion zsh > "${fpath[1]}/_` + binary + `"
  ` + name + ` completion fish > ~/.config/fish/completions/` + binary + `.fish`,
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 || !slices.Contains([]string{"bash", "zsh", "fish"}, args[0]) {
				return usageErrorf("give one shell: bash, zsh or fish")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			root := cmd.Root()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(streams.Out, true)
			case "zsh":
				return root.GenZshCompletion(streams.Out)
			default:
				return root.GenFishCompletion(streams.Out, true)
			}
		},
	}
	return cmd
}

// completionTimeout bounds the API calls that complete a word: a shell
// waits on them.
const completionTimeout = 5 * time.Second

// completePods completes a pod name in the namespace kubectl's flags pick.
func completePods(kube *genericclioptions.ConfigFlags) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, ns, err := kubeClient(kube)
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		var pods corev1.PodList
		return listNames(c, &pods, toComplete, client.InNamespace(ns), func() []string {
			names := make([]string, len(pods.Items))
			for i, p := range pods.Items {
				names[i] = p.Name
			}
			return names
		})
	}
}

// registerKubeCompletions completes --namespace with the cluster's
// namespaces and --context with the kubeconfig's contexts.
func registerKubeCompletions(root *cobra.Command, kube *genericclioptions.ConfigFlags) {
	_ = root.RegisterFlagCompletionFunc("namespace", func(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		c, _, err := kubeClient(kube)
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		var namespaces corev1.NamespaceList
		return listNames(c, &namespaces, toComplete, nil, func() []string {
			names := make([]string, len(namespaces.Items))
			for i, n := range namespaces.Items {
				names[i] = n.Name
			}
			return names
		})
	})
	_ = root.RegisterFlagCompletionFunc("context", func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
		cfg, err := kube.ToRawKubeConfigLoader().RawConfig()
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		var names []cobra.Completion
		for n := range cfg.Contexts {
			names = append(names, n)
		}
		slices.Sort(names)
		return names, cobra.ShellCompDirectiveNoFileComp
	})
}

// listNames lists into list and returns names() that start with prefix.
func listNames(c client.Client, list client.ObjectList, prefix string, opt client.ListOption, names func() []string) ([]cobra.Completion, cobra.ShellCompDirective) {
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	var opts []client.ListOption
	if opt != nil {
		opts = append(opts, opt)
	}
	if err := c.List(ctx, list, opts...); err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var out []cobra.Completion
	for _, n := range names() {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
