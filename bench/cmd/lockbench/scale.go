package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	lw "github.com/lockwarden/lockwarden/pkg/redislock"
	"github.com/redis/go-redis/v9"
)

// scaleRow is one size of the watchdog scale scenario: one lockwarden client
// holding n watchdog locks and doing nothing else while its renewal loop
// runs.
type scaleRow struct {
	n           int
	intervals   int
	acquireTook time.Duration

	// Over the observation window of cfg.intervals renewal ticks.
	roundTrips  int64 // hook: Process calls + pipeline executions
	renewals    int64 // hook: EVALSHA/EVAL sent
	serverEvals int64 // INFO commandstats evalsha+eval delta
	sweeps      []sweep
	// CPU time (user+sys) per second of wall time, one per interval: this
	// process (getrusage) and redis-server (INFO cpu).
	cpuRate, redisRate durations

	heapBefore uint64 // live heap after New, before the Mutexes exist
	heapHeld   uint64 // live heap holding n locks, between two sweeps
	renewLoops int    // goroutines running (*Client).renewLoop while holding
	goroutines int    // goroutines while holding minus before New
	leasesLost int
	stillHeld  int // lock keys that exist after the window
}

// runScale takes n watchdog locks with one lockwarden client, then observes
// cfg.intervals renewal ticks during which the client only holds them.
func runScale(ctx context.Context, cfg config, addr string, admin *redis.Client, n int) (*scaleRow, error) {
	// Every size starts on an empty server, whatever earlier sizes and
	// scenarios left behind.
	if err := admin.FlushAll(ctx).Err(); err != nil {
		return nil, err
	}
	res := &scaleRow{n: n, intervals: cfg.intervals}
	hook := newCounter()
	rdb := newRedisClient(addr, hook)
	defer rdb.Close()

	const workers = 8
	// Open the connections the acquisition (workers) and the renewal loop
	// (go-redis's pipeline pool) will use before the heap baseline: their
	// buffers, 32–128 KiB each, are not the locks' memory.
	if err := parallel(workers*10, workers, func(int) error { return rdb.Ping(ctx).Err() }); err != nil {
		return nil, err
	}
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Ping(ctx)
		return nil
	}); err != nil {
		return nil, err
	}

	gBefore := settledGoroutines()
	tNew := time.Now()
	c, err := lw.New(rdb, lw.Options{WatchdogLease: cfg.scaleLease, RenewInterval: cfg.scaleInterval})
	if err != nil {
		return nil, err
	}
	closed := false
	defer func() {
		if !closed {
			_ = c.Close()
		}
	}()
	res.heapBefore = liveHeap()

	mutexes := make([]*lw.Mutex, n)
	holds := make([]*lw.Hold, n)
	for i := range mutexes {
		if mutexes[i], err = c.NewMutex(fmt.Sprintf("lockbench:scale:%d", i), nil); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	if err := parallel(n, workers, func(i int) error {
		h, err := mutexes[i].TryLock(ctx, 0)
		if err != nil {
			return fmt.Errorf("TryLock %s: %w", mutexes[i].Name(), err)
		}
		holds[i] = h
		return nil
	}); err != nil {
		return nil, err
	}
	acquired := time.Now()
	res.acquireTook = acquired.Sub(start)

	// Ticks are at tNew + k·interval. The window runs from a tenth of an
	// interval before one tick to the same point before the tick after
	// `intervals` more, so it holds whole sweeps as long as a sweep takes
	// under 0.9 intervals (a sweep of 100,000 locks can take most of a
	// second, so many.go's half-interval offset would cut it). Its first
	// tick comes at least an interval after the last acquisition, so the
	// sweep before it already renewed all n locks, and it ends at least a
	// lease after the last acquisition, so a key still present at the end
	// was renewed.
	every := cfg.scaleInterval
	eps := every / 10
	span := time.Duration(cfg.intervals) * every
	first := acquired.Add(eps + max(every, cfg.scaleLease-span)).Sub(tNew)
	k := (first + every - 1) / every
	ws := tNew.Add(time.Duration(k)*every - eps)
	if !sleepUntil(ctx, ws) {
		return nil, ctx.Err()
	}
	s0, err := readCmdStats(ctx, admin)
	if err != nil {
		return nil, err
	}
	r0, err := redisCPU(ctx, admin)
	if err != nil {
		return nil, err
	}
	h0 := hook.snap()
	hook.recordPipelines()
	// CPU is sampled at each tick of the window (a tenth of an interval
	// before it) and the table shows the median interval, so that one
	// interval disturbed by another process on a small machine does not
	// move it.
	t, p, r := time.Now(), selfCPU(), r0
	for i := 1; i <= cfg.intervals; i++ {
		if !sleepUntil(ctx, ws.Add(time.Duration(i)*every)) {
			return nil, ctx.Err()
		}
		ti, pi := time.Now(), selfCPU()
		ri, err := redisCPU(ctx, admin)
		if err != nil {
			return nil, err
		}
		wall := ti.Sub(t).Seconds()
		res.cpuRate = append(res.cpuRate, time.Duration(float64(pi-p)/wall))
		res.redisRate = append(res.redisRate, time.Duration(float64(ri-r)/wall))
		t, p, r = ti, pi, ri
	}
	events := hook.stopRecording()
	h1 := hook.snap()
	s1, err := readCmdStats(ctx, admin)
	if err != nil {
		return nil, err
	}
	d := h1.sub(h0)
	res.roundTrips, res.renewals = d.roundTrips, d.evals
	res.serverEvals = s1.sub(s0).evals()
	// Sweeps of 100,000 locks take about half an interval here, so the
	// quarter-interval gap many.go uses could join two of them.
	res.sweeps = groupSweeps(events, every/20)

	// The window ended a tenth of an interval before the next sweep: measure
	// the heap first, before that sweep's garbage appears.
	res.heapHeld = liveHeap()
	for _, h := range holds {
		if h.Err() != nil {
			res.leasesLost++
		}
	}
	res.renewLoops = countRenewLoops()
	res.goroutines = settledGoroutines() - gBefore
	if res.stillHeld, err = countExisting(ctx, admin, mutexes); err != nil {
		return nil, err
	}

	uctx := context.WithoutCancel(ctx)
	if err := parallel(n, workers, func(i int) error {
		if holds[i].Err() != nil {
			return nil // lost, so not ours to release; the table reports it
		}
		return holds[i].Unlock(uctx)
	}); err != nil {
		return nil, fmt.Errorf("Unlock: %w", err)
	}
	closed = true
	return res, c.Close()
}

// liveHeap returns the bytes of live heap objects. It collects twice
// because objects in sync.Pools survive one collection in the victim cache.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func (r *scaleRow) perInterval(v int64) float64 { return float64(v) / float64(r.intervals) }

// clientCPU and serverCPU are the median interval's CPU time per second.
func (r *scaleRow) clientCPU() time.Duration { return r.cpuRate.sorted().pct(50) }
func (r *scaleRow) serverCPU() time.Duration { return r.redisRate.sorted().pct(50) }

func (r *scaleRow) heapDelta() int64 { return int64(r.heapHeld) - int64(r.heapBefore) }

func (r *scaleRow) sweepTook() durations {
	var d durations
	for _, s := range r.sweeps {
		d = append(d, s.took)
	}
	return d.sorted()
}
