// Command lockwarden runs a command while holding a lockwarden Redis lock,
// for jobs, such as CronJobs, that take the lock themselves instead of
// waiting behind a DistributedLock's scheduling gate, and explains why a pod
// waits behind one:
//
//	lockwarden run --lock NAME -- CMD [ARG...]
//	lockwarden why [-n NAMESPACE] POD
//	lockwarden free (-n NAMESPACE | -A)
//
// `lockwarden run --help` documents the flags, the environment and the exit
// statuses; `lockwarden why --help` and `lockwarden free --help` theirs.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/lockwarden/lockwarden/pkg/redislock"
)

func main() { os.Exit(lockwarden(os.Args[1:])) }

// lockwarden dispatches to the subcommand and returns the exit status.
func lockwarden(args []string) int {
	switch {
	case len(args) > 0 && args[0] == "run":
		return runMain(args[1:])
	case len(args) > 0 && args[0] == "why":
		return whyMain(args[1:], os.Stdout, os.Stderr)
	case len(args) > 0 && args[0] == "free":
		return freeMain(args[1:], os.Stdout, os.Stderr)
	case len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help"):
		usage(os.Stdout)
		return 0
	}
	fmt.Fprint(os.Stderr, usageHint)
	return exitUsage
}

func runMain(args []string) int {
	g, err := parseRun(args)
	if errors.Is(err, flag.ErrHelp) {
		usage(os.Stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "lockwarden run: %v\n%s", err, usageHint)
		return exitUsage
	}
	return g.run()
}

// waitForever is guard.wait when neither --wait nor --skip is given.
const waitForever time.Duration = -1

// parseRun returns the guard the arguments of `run` describe, flag.ErrHelp
// for --help, or a usage error.
func parseRun(args []string) (*guard, error) {
	g := &guard{}
	var skip bool
	fs := newFlagSet(g, &skip)
	fs.SetOutput(io.Discard) // runMain reports errors, with the usage
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	g.argv = fs.Args()
	waitSet := false
	fs.Visit(func(f *flag.Flag) { waitSet = waitSet || f.Name == "wait" })
	switch {
	case (g.lock == "") == (g.resource == ""):
		return nil, errors.New("give one of --lock and --lock-resource")
	case skip && waitSet:
		return nil, errors.New("give --skip or --wait, not both")
	case g.wait < 0:
		return nil, errors.New("--wait must not be negative")
	case g.grace < 0:
		return nil, errors.New("--grace must not be negative")
	case g.lease < redislock.MinLease || g.lease%time.Millisecond != 0:
		return nil, fmt.Errorf("--lease must be a whole number of milliseconds, at least %v", redislock.MinLease)
	case len(g.argv) == 0:
		return nil, errors.New("no command to run; give it after --")
	}
	if skip {
		g.wait = 0
	} else if !waitSet {
		g.wait = waitForever
	}
	return g, nil
}

func newFlagSet(g *guard, skip *bool) *flag.FlagSet {
	fs := flag.NewFlagSet("lockwarden run", flag.ContinueOnError)
	fs.StringVar(&g.lock, "lock", "", "the Redis lock `name`; a DistributedLock's is its spec.key, else \"<namespace>/<name>\"")
	fs.StringVar(&g.resource, "lock-resource", "", "instead of --lock: the lock \"$POD_NAMESPACE/<name>\" of the DistributedLock `name`\nin this pod's namespace, if its spec sets no key; give that lock spec.mode: Observe,\nso the controller shows and cleans up after this pod's hold instead of taking the lock")
	fs.DurationVar(&g.wait, "wait", 0, "how long to wait while the lock is held elsewhere, then exit 75. Default: until\nit is free; in a CronJob, bound it here or with activeDeadlineSeconds")
	fs.BoolVar(skip, "skip", false, "exit 75 at once if the lock is held elsewhere (--wait 0)")
	fs.DurationVar(&g.grace, "grace", 10*time.Second, "how long CMD has after SIGTERM before SIGKILL")
	fs.DurationVar(&g.lease, "lease", 30*time.Second, "the lock's lease, renewed every third of it: how long the lock outlives a\nlockwarden that dies, and about how soon losing Redis counts as losing the lock")
	return fs
}

// usageHint is printed after a usage error.
const usageHint = usageLine + "Run 'lockwarden run --help' for the flags and exit statuses.\n"

const usageLine = "Usage: lockwarden run [flags] -- CMD [ARG...]\n       lockwarden why [-n NAMESPACE] POD\n       lockwarden free (-n NAMESPACE | -A)\n"

func usage(w io.Writer) {
	fmt.Fprint(w, usageLine+`
Runs CMD only while holding a lockwarden (Redisson-compatible) Redis lock. It
takes the lock, then runs CMD with stdin, stdout and stderr passed through,
and releases the lock when CMD exits. CMD's environment gets LOCKWARDEN_LOCK,
the lock name, and LOCKWARDEN_FENCING_TOKEN, to pass to the resource it
protects.

If the lock is lost while CMD runs, CMD gets SIGTERM, then SIGKILL after
--grace. SIGTERM and SIGINT to lockwarden are passed on to CMD the same way,
and the lock is released once CMD exits. CMD runs in its own process group,
which the signals go to so they reach its children too; so it is not meant
for interactive terminal programs.

Redis and the pod come from the environment: REDIS_URL, or
REDIS_SENTINEL_ADDRS with REDIS_SENTINEL_MASTER, or REDIS_CLUSTER_ADDRS;
optionally REDIS_USERNAME, REDIS_PASSWORD or REDIS_PASSWORD_FILE, REDIS_TLS
and REDIS_CA_FILE; and POD_UID, POD_NAME and POD_NAMESPACE from the downward
API. The lock's owner ID is "<POD_UID>:<n>", so the DistributedLock controller
shows the hold and releases it if the pod ends.

Flags (- or --):
`)
	fs := newFlagSet(new(guard), new(bool))
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprint(w, `
Exit status:
  CMD's exit status, or 128+N if CMD was killed by signal N, as in shells
  2    bad usage, or an invalid lock name
  69   the environment or Redis failed before CMD ran
  75   the lock is held elsewhere: --skip, or --wait ran out; CMD did not run
  124  the lock was lost while CMD ran, and CMD died of the signals that
       followed (a CMD that exits by itself then exits with its own status)
  126  CMD could not be started
  127  CMD was not found
  128+N  lockwarden got signal N while waiting for the lock; CMD did not run
`)
}
