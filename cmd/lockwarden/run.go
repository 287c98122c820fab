package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// Exit statuses of lockwarden's own outcomes. Otherwise it exits with CMD's.
// Outcomes before CMD runs use sysexits(3) codes; outcomes about CMD use the
// codes shells and timeout(1) use.
const (
	exitUsage = 2
	// exitUnavailable (EX_UNAVAILABLE): the environment or Redis failed.
	exitUnavailable = 69
	// exitLocked (EX_TEMPFAIL): the lock is held elsewhere; a later run may
	// get it.
	exitLocked = 75
	// exitLockLost: the lock was lost and CMD died of the signals that
	// followed, as timeout(1) reports a command it stopped.
	exitLockLost  = 124
	exitCannotRun = 126
	exitNotFound  = 127
	// exitSignal+N: killed by signal N.
	exitSignal = 128
)

// signalNames names the signals lockwarden passes on, for its log.
var signalNames = map[os.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGINT: "SIGINT"}

// releaseTimeout bounds the final Unlock, so an unreachable Redis cannot
// hold up the exit; the lease then runs out on its own.
const releaseTimeout = 5 * time.Second

// newRunCmd is `lockwarden run`. It parses its own flags: it takes none of
// kubectl's, stops at CMD (the first argument that is not a flag, or after
// --), and accepts its flags with one dash too (-lock NAME), as it always
// has.
func newRunCmd(name string, streams genericiooptions.IOStreams) *cobra.Command {
	cmd := &cobra.Command{
		Use:                "run (--lock NAME | --lock-resource NAME) [flags] -- CMD [ARG...]",
		Short:              "Run a command while holding a lockwarden Redis lock (in a job's container)",
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			g, err := parseRun(args)
			switch {
			case errors.Is(err, pflag.ErrHelp):
				runUsage(streams.Out, name)
				return nil
			case err != nil:
				return usageError{err}
			}
			if code := g.run(); code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
	cmd.SetHelpFunc(func(*cobra.Command, []string) { runUsage(streams.Out, name) })
	return cmd
}

// waitForever is guard.wait when neither --wait nor --skip is given.
const waitForever time.Duration = -1

// parseRun returns the guard the arguments of `run` describe,
// pflag.ErrHelp for --help, or a usage error.
func parseRun(args []string) (*guard, error) {
	g := &guard{}
	var skip bool
	fs := runFlags(g, &skip)
	if err := fs.Parse(twoDashes(fs, args)); err != nil {
		return nil, err
	}
	if help, _ := fs.GetBool("help"); help {
		return nil, pflag.ErrHelp
	}
	g.argv = fs.Args()
	waitSet := fs.Changed("wait")
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

// runFlags are run's flags. Parsing stops at CMD, the first argument that
// is not a flag: CMD's own flags are CMD's.
func runFlags(g *guard, skip *bool) *pflag.FlagSet {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(io.Discard) // the caller reports errors
	fs.SetInterspersed(false)
	fs.SortFlags = false
	fs.StringVar(&g.lock, "lock", "", "the Redis lock `name`; a DistributedLock's is its spec.key, else \"<namespace>/<name>\"")
	fs.StringVar(&g.resource, "lock-resource", "", "instead of --lock: the lock \"$POD_NAMESPACE/<name>\" of the DistributedLock `name`\nin this pod's namespace, if its spec sets no key; give that lock spec.mode: Observe,\nso the controller shows and cleans up after this pod's hold instead of taking the lock")
	fs.DurationVar(&g.wait, "wait", 0, "how long to wait while the lock is held elsewhere, then exit 75. Default: until\nit is free; in a CronJob, bound it here or with activeDeadlineSeconds")
	fs.BoolVar(skip, "skip", false, "exit 75 at once if the lock is held elsewhere (--wait 0)")
	fs.DurationVar(&g.grace, "grace", 10*time.Second, "how long CMD has after SIGTERM before SIGKILL")
	fs.DurationVar(&g.lease, "lease", 30*time.Second, "the lock's lease, renewed every third of it: how long the lock outlives a\nlockwarden that dies, and about how soon losing Redis counts as losing the lock")
	fs.BoolP("help", "h", false, "show this help")
	return fs
}

// twoDashes rewrites the long flags of fs given with one dash (-lock NAME,
// -wait=5m) to two, up to CMD: run was first built on Go's flag package,
// which takes both, and job images call it either way.
func twoDashes(fs *pflag.FlagSet, args []string) []string {
	out := append([]string(nil), args...)
	for i := 0; i < len(out); i++ {
		a := out[i]
		if a == "--" || a == "-" || !strings.HasPrefix(a, "-") {
			break // CMD starts here
		}
		name, hasValue := strings.CutPrefix(a, "--")
		if !hasValue {
			name = a[1:]
		}
		name, _, inline := strings.Cut(name, "=")
		f := fs.Lookup(name)
		if f == nil {
			continue // pflag reports it
		}
		if !strings.HasPrefix(a, "--") && len(name) > 1 {
			out[i] = "-" + a
		}
		if !inline && f.Value.Type() != "bool" {
			i++ // its value
		}
	}
	return out
}

// runUsage is run's help.
func runUsage(w io.Writer, name string) {
	fmt.Fprintf(w, "Usage: %s run (--lock NAME | --lock-resource NAME) [flags] -- CMD [ARG...]\n", name)
	fmt.Fprint(w, `
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
shows the hold and releases it if the pod ends. kubectl's flags do not apply.

Flags (- or --):
`)
	fmt.Fprint(w, runFlags(new(guard), new(bool)).FlagUsages())
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

// guard is one `lockwarden run`.
type guard struct {
	lock     string        // the Redis lock name (--lock), or
	resource string        // a DistributedLock in $POD_NAMESPACE (--lock-resource)
	wait     time.Duration // how long to wait for the lock, or waitForever
	grace    time.Duration // from SIGTERM to SIGKILL
	lease    time.Duration // the watchdog lease
	argv     []string      // CMD
}

// run takes the lock, runs CMD under it, releases it, and returns the exit
// status.
func (g *guard) run() int {
	c, err := redislock.FromEnv(redislock.Options{WatchdogLease: g.lease})
	if err != nil {
		logf("%v", err)
		return exitUnavailable
	}
	defer c.Close()
	name := g.lock
	if g.resource != "" {
		name = redislock.LockName(c.Pod().Namespace, g.resource)
	}
	m, err := c.NewMutex(name, nil)
	if err != nil {
		logf("%v", err)
		return exitUsage
	}

	// From here on, SIGTERM and SIGINT must not kill lockwarden outright,
	// which would leave the lock held until its lease ran out.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT) // the signals in signalNames
	defer signal.Stop(signals)

	hold, code := g.acquire(m, signals)
	if hold == nil {
		return code
	}
	code, lost := g.supervise(hold, signals)
	release(hold, lost)
	return code
}

// acquire takes the lock, waiting as --wait and --skip say. A signal ends
// the wait, and lockwarden exits as if killed by it. It returns the hold,
// or nil and the exit status.
func (g *guard) acquire(m *redislock.Mutex, signals <-chan os.Signal) (*redislock.Hold, int) {
	type result struct {
		hold *redislock.Hold
		err  error
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan result, 1)
	go func() {
		var r result
		if g.wait == waitForever {
			r.hold, r.err = m.Lock(ctx)
		} else {
			r.hold, r.err = m.TryLock(ctx, g.wait)
		}
		done <- r
	}()

	var r result
	select {
	case r = <-done:
	case sig := <-signals:
		cancel()
		if r = <-done; r.err == nil { // taken as the signal came
			release(r.hold, false)
		}
		logf("got %s while waiting for lock %q; not running %s", signalNames[sig], m.Name(), g.argv[0])
		return nil, exitSignal + int(sig.(syscall.Signal))
	}
	switch {
	case r.err == nil:
		return r.hold, 0
	case errors.Is(r.err, redislock.ErrWaitTimeout):
		logf("lock %q is held elsewhere; gave up after waiting %v; not running %s", m.Name(), g.wait, g.argv[0])
		return nil, exitLocked
	default:
		logf("cannot take lock %q: %v", m.Name(), r.err)
		return nil, exitUnavailable
	}
}

// supervise runs CMD while hold holds, and stops it if the lock is lost or
// lockwarden is signalled. It returns the exit status and whether the lock
// was lost.
func (g *guard) supervise(hold *redislock.Hold, signals <-chan os.Signal) (code int, lost bool) {
	cmd := exec.Command(g.argv[0], g.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"LOCKWARDEN_LOCK="+hold.Name(),
		"LOCKWARDEN_FENCING_TOKEN="+strconv.FormatInt(hold.Token(), 10))
	// CMD leads its own process group, and signals go to the group: a
	// shell script's current command would otherwise keep running after
	// the lock is lost, or outlive a SIGKILLed shell.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf("cannot run %s: %v", g.argv[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return exitNotFound, false
		}
		return exitCannotRun, false
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait() // the status is read from cmd.ProcessState
		close(exited)
	}()

	group := -cmd.Process.Pid
	var kill <-chan time.Time // armed by the first signal to CMD
	stop := func(sig syscall.Signal) {
		_ = syscall.Kill(group, sig)
		if kill == nil {
			kill = time.After(g.grace)
		}
	}
	holdDone := hold.Done()
	for {
		select {
		case <-exited:
			return exitStatus(cmd.ProcessState, lost), lost
		case <-holdDone:
			// Only a loss ends the hold before release: ErrNotOwner or
			// ErrLeaseLost.
			holdDone, lost = nil, true
			logf("lost lock %q: %v; stopping %s with SIGTERM", hold.Name(), hold.Err(), g.argv[0])
			stop(syscall.SIGTERM)
		case sig := <-signals:
			logf("got %s; passing it on to %s", signalNames[sig], g.argv[0])
			stop(sig.(syscall.Signal))
		case <-kill:
			logf("%s still running %v after the signal; sending SIGKILL", g.argv[0], g.grace)
			_ = syscall.Kill(group, syscall.SIGKILL)
		}
	}
}

// exitStatus is CMD's exit status as shells report it, except that a CMD
// killed after the lock was lost reports the loss.
func exitStatus(ps *os.ProcessState, lost bool) int {
	ws := ps.Sys().(syscall.WaitStatus)
	switch {
	case !ws.Signaled():
		return ws.ExitStatus()
	case lost:
		return exitLockLost
	default:
		return exitSignal + int(ws.Signal())
	}
}

// release unlocks the hold. After a loss it still tries, since the lock may
// yet be ours on the server if only renewals failed, but its error is
// expected.
func release(hold *redislock.Hold, lost bool) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := hold.Unlock(ctx); err != nil && !lost {
		logf("cannot release lock %q: %v; it expires when its lease runs out", hold.Name(), err)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "lockwarden: "+format+"\n", args...)
}
