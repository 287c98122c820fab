package main

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	lw "github.com/lockwarden/lockwarden/pkg/redislock"
	"github.com/redis/go-redis/v9"
)

// manyResult is the "N locks held by one client" scenario.
type manyResult struct {
	n         int
	intervals int
	lease     time.Duration
	every     time.Duration

	// lockwarden, over the observation window of `intervals` renewal ticks
	roundTrips  int64 // hook: Process calls + pipeline executions
	renewals    int64 // hook: EVALSHA/EVAL sent
	serverEvals int64 // INFO commandstats evalsha+eval delta
	sweeps      []sweep
	renewLoops  int // goroutines running (*Client).renewLoop while holding
	gBefore     int // goroutines before New
	gAfterNew   int
	gHoldSome   int // holding n/10 locks
	gHoldAll    int // holding n locks
	gAfterClose int
	leasesLost  int
	stillHeld   int // lock keys that exist after the window (lease < window)
	acquireTook time.Duration

	peers map[string]peerMany
}

type sweep struct {
	pipelines int
	renewals  int
	took      time.Duration
}

// peerMany is what a caller of a peer library does to keep n locks: one
// Extend/Refresh call per lock.
type peerMany struct {
	roundTrips int64
	cmds       int64
	took       time.Duration // one sequential pass over all locks
	failed     int
}

func settledGoroutines() int {
	prev := runtime.NumGoroutine()
	for range 50 {
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == prev {
			return n
		}
		prev = n
	}
	return prev
}

func countRenewLoops() int {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
	n := 0
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(g, "redislock.(*Client).renewLoop(") {
			n++
		}
	}
	return n
}

// parallel runs f(i) for i in [0, n) on `workers` goroutines and returns the
// first error.
func parallel(n, workers int, f func(i int) error) error {
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					errOnce.Do(func() { first = err })
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

func runMany(ctx context.Context, cfg config, addr string, admin *redis.Client) (*manyResult, error) {
	res := &manyResult{n: cfg.locks, intervals: cfg.intervals, lease: cfg.lease, every: cfg.interval, peers: make(map[string]peerMany)}
	if err := runManyOurs(ctx, cfg, addr, admin, res); err != nil {
		return nil, fmt.Errorf("lockwarden: %w", err)
	}
	for _, lib := range libraries[1:] {
		p, err := runManyPeer(ctx, cfg, addr, lib)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", lib.name, err)
		}
		res.peers[lib.name] = p
	}
	return res, nil
}

func runManyOurs(ctx context.Context, cfg config, addr string, admin *redis.Client, res *manyResult) error {
	hook := newCounter()
	rdb := newRedisClient(addr, hook)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return err
	}

	res.gBefore = settledGoroutines()
	tNew := time.Now()
	c, err := lw.New(rdb, lw.Options{WatchdogLease: cfg.lease, RenewInterval: cfg.interval})
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			_ = c.Close()
		}
	}()
	res.gAfterNew = settledGoroutines()

	mutexes := make([]*lw.Mutex, cfg.locks)
	holds := make([]*lw.Hold, cfg.locks)
	for i := range mutexes {
		if mutexes[i], err = c.NewMutex(fmt.Sprintf("lockbench:many:%d", i), nil); err != nil {
			return err
		}
	}
	acquire := func(i int) error {
		h, err := mutexes[i].TryLock(ctx, 0)
		if err != nil {
			return fmt.Errorf("TryLock %s: %w", mutexes[i].Name(), err)
		}
		holds[i] = h
		return nil
	}
	const workers = 8
	some := max(1, cfg.locks/10)
	start := time.Now()
	if err := parallel(some, workers, acquire); err != nil {
		return err
	}
	res.gHoldSome = settledGoroutines()
	if err := parallel(cfg.locks-some, workers, func(i int) error { return acquire(some + i) }); err != nil {
		return err
	}
	res.acquireTook = time.Since(start)
	res.gHoldAll = settledGoroutines()
	res.renewLoops = countRenewLoops()

	// Observe exactly `intervals` ticks: the window runs from half an
	// interval after one tick to half an interval after the last one
	// (ticks are at tNew + k·interval).
	k := int(time.Since(tNew)/cfg.interval) + 1
	ws := tNew.Add(time.Duration(k)*cfg.interval + cfg.interval/2)
	we := ws.Add(time.Duration(cfg.intervals) * cfg.interval)
	if !sleepUntil(ctx, ws) {
		return ctx.Err()
	}
	s0, err := readCmdStats(ctx, admin)
	if err != nil {
		return err
	}
	h0 := hook.snap()
	hook.recordPipelines()
	if !sleepUntil(ctx, we) {
		return ctx.Err()
	}
	events := hook.stopRecording()
	h1 := hook.snap()
	s1, err := readCmdStats(ctx, admin)
	if err != nil {
		return err
	}
	d := h1.sub(h0)
	res.roundTrips, res.renewals = d.roundTrips, d.evals
	res.serverEvals = s1.sub(s0).evals()
	res.sweeps = groupSweeps(events, cfg.interval/4)

	for _, h := range holds {
		if h.Err() != nil {
			res.leasesLost++
		}
	}
	// Every lock was taken more than a lease ago (the window alone is
	// `intervals` ≥ 3 renew intervals ≥ the lease), so its key only exists
	// if the watchdog renewed it.
	if res.stillHeld, err = countExisting(ctx, admin, mutexes); err != nil {
		return err
	}

	uctx := context.WithoutCancel(ctx)
	if err := parallel(cfg.locks, workers, func(i int) error { return holds[i].Unlock(uctx) }); err != nil {
		return fmt.Errorf("Unlock: %w", err)
	}
	closed = true
	if err := c.Close(); err != nil {
		return err
	}
	res.gAfterClose = settledGoroutines()
	return nil
}

// countExisting returns how many of the mutexes' lock keys exist, asking
// admin in pipelines of 1,000 EXISTS.
func countExisting(ctx context.Context, admin *redis.Client, mutexes []*lw.Mutex) (int, error) {
	n := 0
	for from := 0; from < len(mutexes); from += 1000 {
		to := min(len(mutexes), from+1000)
		pipe := admin.Pipeline()
		cmds := make([]*redis.IntCmd, 0, to-from)
		for _, m := range mutexes[from:to] {
			cmds = append(cmds, pipe.Exists(ctx, m.Name()))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return 0, err
		}
		for _, cmd := range cmds {
			if cmd.Val() == 1 {
				n++
			}
		}
	}
	return n, nil
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	select {
	case <-time.After(time.Until(t)):
		return true
	case <-ctx.Done():
		return false
	}
}

// groupSweeps groups pipeline executions into renewal sweeps: a gap longer
// than gap starts a new sweep.
func groupSweeps(events []pipeEvent, gap time.Duration) []sweep {
	sort.Slice(events, func(i, j int) bool { return events[i].start.Before(events[j].start) })
	var (
		out        []sweep
		cur        sweep
		first, end time.Time
	)
	for _, e := range events {
		if cur.pipelines > 0 && e.start.Sub(end) > gap {
			cur.took = end.Sub(first)
			out = append(out, cur)
			cur = sweep{}
		}
		if cur.pipelines == 0 {
			first = e.start
		}
		cur.pipelines++
		cur.renewals += e.size
		if t := e.start.Add(e.took); t.After(end) {
			end = t
		}
	}
	if cur.pipelines > 0 {
		cur.took = end.Sub(first)
		out = append(out, cur)
	}
	return out
}

// runManyPeer takes n locks with a peer library and times one sequential
// pass of Extend (redsync) / Refresh (bsm) over them: what a caller of that
// library has to do every renewal interval.
func runManyPeer(ctx context.Context, cfg config, addr string, lib library) (peerMany, error) {
	var p peerMany
	hook := newCounter()
	rdb := newRedisClient(addr, hook)
	defer rdb.Close()
	newLocker, closeFn, err := lib.client(rdb)
	if err != nil {
		return p, err
	}
	defer closeFn()
	lockers := make([]locker, cfg.locks)
	for i := range lockers {
		if lockers[i], err = newLocker(fmt.Sprintf("lockbench:many:%s:%d", lib.name, i)); err != nil {
			return p, err
		}
	}
	const workers = 8
	if err := parallel(cfg.locks, workers, func(i int) error {
		switch l := lockers[i].(type) {
		case *redsyncLocker:
			return l.m.TryLockContext(ctx)
		case *bsmLocker:
			return l.tryOnce(ctx)
		}
		return fmt.Errorf("unknown locker %T", lockers[i])
	}); err != nil {
		return p, err
	}

	extend := func(lk locker) (bool, error) {
		switch l := lk.(type) {
		case *redsyncLocker:
			return l.m.ExtendContext(ctx)
		case *bsmLocker:
			err := l.held.Refresh(ctx, peerTTL, nil)
			return err == nil, err
		}
		return false, fmt.Errorf("unknown locker %T", lk)
	}
	// Load the script first, so the pass has no NOSCRIPT → EVAL retry.
	if _, err := extend(lockers[0]); err != nil {
		return p, err
	}
	h0 := hook.snap()
	start := time.Now()
	for _, lk := range lockers {
		ok, _ := extend(lk)
		if ctx.Err() != nil {
			return p, ctx.Err()
		}
		if !ok {
			p.failed++
		}
	}
	p.took = time.Since(start)
	d := hook.snap().sub(h0)
	p.roundTrips, p.cmds = d.roundTrips, d.cmds

	uctx := context.WithoutCancel(ctx)
	if err := parallel(cfg.locks, workers, func(i int) error { return lockers[i].unlock(uctx) }); err != nil {
		return p, fmt.Errorf("unlock: %w", err)
	}
	return p, nil
}
