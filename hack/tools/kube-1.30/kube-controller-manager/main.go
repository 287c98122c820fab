// Command kube-controller-manager builds the controller manager of the local
// control plane (internal/plane) from the same module, and so the same
// k8s.io/* v0.36.3 dependency set and build cache, as kube-apiserver. It
// mirrors upstream's cmd/kube-controller-manager/controller-manager.go.
// Version information is injected with -ldflags by hack/setup-plane.sh.
package main

import (
	"os"
	_ "time/tzdata" // CronJob spec.timeZone needs the zone database on any host

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	command := app.NewControllerManagerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
