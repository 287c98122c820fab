// Command kube-scheduler builds the scheduler of the local control plane
// (internal/plane) from the same module, and so the same k8s.io/* v0.36.3
// dependency set and build cache, as kube-apiserver. It mirrors upstream's
// cmd/kube-scheduler/scheduler.go. Version information is injected with
// -ldflags by hack/setup-plane.sh.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	command := app.NewSchedulerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
