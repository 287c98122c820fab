// Command kubectl builds kubectl from the same module (and thus the same
// k8s.io/* v0.36.3 dependency set) as kube-apiserver. It mirrors upstream's
// cmd/kubectl/kubectl.go. Version information is injected with -ldflags by
// hack/setup-envtest.sh.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	// Import to initialize client auth plugins.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	// Set verbosity before command construction, as upstream does, so klog
	// works while plugins and .kuberc are handled.
	logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		// Pretty-print the error and exit with an error.
		util.CheckErr(err)
	}
}
