package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// contendedResult accumulates one library's contended runs (all rounds).
type contendedResult struct {
	acquisitions int64         // completed inside the measurement windows
	window       time.Duration // total length of the windows
	waits        durations     // acquire call start → return, inside the windows
	holds        durations     // actual hold time (pause accuracy check)
	hook         snap
	server       cmdStats
	failed       int64 // acquire calls that gave up and were retried
	violations   int64 // acquisitions that found another holder
	errors       int64
	firstErr     string
	warmupMax    time.Duration // longest wait during the warm-ups
	redisCPU     time.Duration // redis-server CPU (user+sys) inside the windows
	selfCPU      time.Duration // this process's CPU inside the windows
}

func (r *contendedResult) throughput() float64 {
	if r.window <= 0 {
		return 0
	}
	return float64(r.acquisitions) / r.window.Seconds()
}

func (r *contendedResult) sent() sent { return measureSent(r.hook, r.server) }

func (r *contendedResult) cmdsPerAcq() float64 {
	if r.acquisitions == 0 {
		return 0
	}
	return float64(r.sent().total) / float64(r.acquisitions)
}

// serverCmdsPerAcq is the Redis commands per acquisition as INFO
// commandstats counts them: every call in the windows' deltas, commands that
// scripts call included, but not the harness's own INFO calls that open and
// close each window.
func (r *contendedResult) serverCmdsPerAcq() float64 {
	if r.acquisitions == 0 {
		return 0
	}
	return float64(r.server.calls()) / float64(r.acquisitions)
}

type sample struct {
	start, acquired time.Duration // since the run's base time
	hold            time.Duration
	failed          int
}

// runContended runs cfg.clients workers, each with its own go-redis client
// and lock client, on one lock name for warmup + window, and adds the
// window's results to res.
func runContended(ctx context.Context, cfg config, addr string, admin *redis.Client, lib library, window time.Duration, res *contendedResult) error {
	hook := newCounter()
	name := "lockbench:contended:" + lib.name
	lockers := make([]locker, cfg.clients)
	for i := range lockers {
		rdb := newRedisClient(addr, hook)
		defer rdb.Close()
		if err := rdb.Ping(ctx).Err(); err != nil { // dial before the clock starts
			return err
		}
		newLocker, closeFn, err := lib.client(rdb)
		if err != nil {
			return err
		}
		defer closeFn()
		if lockers[i], err = newLocker(name); err != nil {
			return err
		}
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		stop       atomic.Bool
		holders    atomic.Int32
		violations atomic.Int64
		errCount   atomic.Int64
		errOnce    sync.Once
		firstErr   string
		wg         sync.WaitGroup
	)
	base := time.Now()
	samples := make([][]sample, cfg.clients)
	noteErr := func(err error) {
		errCount.Add(1)
		errOnce.Do(func() { firstErr = err.Error() })
		pause(time.Millisecond)
	}
	for i, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && runCtx.Err() == nil {
				start := time.Since(base)
				failed, err := l.lock(runCtx)
				acquired := time.Since(base)
				if err != nil {
					if runCtx.Err() == nil {
						noteErr(fmt.Errorf("lock: %w", err))
					}
					continue
				}
				if holders.Add(1) != 1 {
					violations.Add(1)
				}
				pause(cfg.hold)
				held := time.Since(base) - acquired
				holders.Add(-1)
				uctx, ucancel := context.WithTimeout(context.WithoutCancel(runCtx), 10*time.Second)
				err = l.unlock(uctx)
				ucancel()
				if err != nil {
					noteErr(fmt.Errorf("unlock: %w", err))
				}
				samples[i] = append(samples[i], sample{start: start, acquired: acquired, hold: held, failed: failed})
				pause(cfg.think)
			}
		}()
	}

	// The controller: warm up, then open and close the measurement window.
	var (
		t0, t1 time.Duration
		h0, h1 snap
		s0, s1 cmdStats
		r0, r1 time.Duration // redis-server CPU
		p0, p1 time.Duration // own CPU
		ctlErr error
	)
	sleepCtx := func(d time.Duration) bool {
		select {
		case <-time.After(d):
			return true
		case <-ctx.Done():
			return false
		}
	}
	if sleepCtx(cfg.warmup) {
		h0 = hook.snap()
		if s0, ctlErr = readCmdStats(ctx, admin); ctlErr == nil {
			r0, ctlErr = redisCPU(ctx, admin)
			p0 = selfCPU()
			t0 = time.Since(base)
			if ctlErr == nil && sleepCtx(window) {
				t1 = time.Since(base)
				h1 = hook.snap()
				p1 = selfCPU()
				if r1, ctlErr = redisCPU(ctx, admin); ctlErr == nil {
					s1, ctlErr = readCmdStats(ctx, admin)
				}
			}
		}
	}
	stop.Store(true)

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		return fmt.Errorf("%s: workers still blocked 30s after the end of the run", lib.name)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if ctlErr != nil {
		return ctlErr
	}

	for _, ws := range samples {
		for _, s := range ws {
			if s.acquired < t0 && s.start < t0 {
				res.warmupMax = max(res.warmupMax, s.acquired-s.start)
			}
			if s.acquired >= t0 && s.acquired < t1 {
				res.acquisitions++
				res.failed += int64(s.failed)
				res.holds = append(res.holds, s.hold)
				if s.start >= t0 {
					res.waits = append(res.waits, s.acquired-s.start)
				}
			}
		}
	}
	res.window += t1 - t0
	res.redisCPU += r1 - r0
	res.selfCPU += p1 - p0
	res.hook = addSnap(res.hook, h1.sub(h0))
	res.server = addStats(res.server, s1.sub(s0))
	res.violations += violations.Load()
	if n := errCount.Load(); n > 0 {
		res.errors += n
		if res.firstErr == "" {
			res.firstErr = firstErr
		}
	}
	return nil
}

// redisCPU returns redis-server's CPU time so far (INFO cpu, user + sys).
func redisCPU(ctx context.Context, admin *redis.Client) (time.Duration, error) {
	info, err := admin.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, f := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(infoField(info, f), 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s: %w", f, err)
		}
		total += v
	}
	return time.Duration(total * float64(time.Second)), nil
}

// selfCPU returns this process's CPU time so far (user + sys).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
