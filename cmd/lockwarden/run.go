package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

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
