// Command demo plays lockwarden's story on this machine, with no cluster: it
// starts a local control plane (internal/plane: etcd, kube-apiserver with
// the DistributedLock CRD, kube-controller-manager, kube-scheduler, and kwok
// running pods on two fake nodes), a redis-server and the manager, then
// drives them with the real kubectl: leader election among a Deployment's
// pods, a CronJob's runs queued behind the scheduling gate, a handover when
// the leader's pod is deleted, and a lock taken by an in-pod client. Nothing
// is played by hand: pods run, complete and fail as the stages say. Every
// step checks what it shows; the exit status is 0 only if all checks held.
// Everything it starts is stopped on exit, on error and on Ctrl-C.
//
//	go run ./cmd/demo                  # from anywhere in the repository
//	go run ./cmd/demo -keep-running    # then leave it all up until Ctrl-C
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	var opts options
	flag.StringVar(&opts.manager, "manager", "", "the manager binary to run (default: bin/manager, built first if it is missing or older than its sources)")
	flag.BoolVar(&opts.keepRunning, "keep-running", false, "after the story, leave everything running for kubectl until Ctrl-C")
	flag.Parse()

	// Children run in process groups of their own, so a Ctrl-C reaches only
	// the demo, which then stops them in order.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Stdout, opts)
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled):
		os.Exit(130)
	default:
		fmt.Fprintln(os.Stderr, "demo failed:", firstLine(err.Error()))
		os.Exit(1)
	}
}
