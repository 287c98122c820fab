package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockwarden/lockwarden/internal/redistest"
	lw "github.com/lockwarden/lockwarden/pkg/redislock"
)

// The mixed fleet: lockwarden clients and clients running Redisson's own
// RLock scripts contend for one lock, on a machine kept busy by CPU burners,
// and the Redisson side must get its share. Redisson's clients do not queue:
// they take the lock whenever they find it free, so lockwarden's hand-overs
// alone would starve them.

// mixedResult is one mixed-fleet run.
type mixedResult struct {
	perSide, burners int
	window           time.Duration
	ours, theirs     int64
	overlaps, errors int64
	firstErr         string
}

func runMixed(ctx context.Context, cfg config, addr string) (*mixedResult, error) {
	const perSide = 4
	name := "lockbench:mixed"
	res := &mixedResult{perSide: perSide, burners: runtime.NumCPU(), window: cfg.mixed}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		inside   atomic.Int32
		measure  atomic.Bool
		ours     atomic.Int64
		theirs   atomic.Int64
		overlaps atomic.Int64
		errs     atomic.Int64
		errOnce  sync.Once
	)
	noteErr := func(err error) {
		if runCtx.Err() != nil {
			return
		}
		errs.Add(1)
		errOnce.Do(func() { res.firstErr = err.Error() })
		pause(time.Millisecond)
	}
	critical := func(side *atomic.Int64) {
		if inside.Add(1) != 1 {
			overlaps.Add(1)
		}
		pause(cfg.hold)
		inside.Add(-1)
		if measure.Load() {
			side.Add(1)
		}
	}

	// The machine is loaded: one busy goroutine per CPU.
	for range res.burners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				for i := 0; i < 1_000_000; i++ {
					_ = i * i
				}
				runtime.Gosched()
			}
		}()
	}
	for i := range perSide {
		rdb := newRedisClient(addr, nil)
		defer rdb.Close()
		c, err := lw.New(rdb, lw.Options{})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		m, err := c.NewMutex(name, nil)
		if err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				hold, err := m.Lock(runCtx)
				if err != nil {
					noteErr(fmt.Errorf("lockwarden lock: %w", err))
					continue
				}
				critical(&ours)
				if err := hold.Unlock(context.WithoutCancel(runCtx)); err != nil {
					noteErr(fmt.Errorf("lockwarden unlock: %w", err))
				}
				pause(cfg.think)
			}
		}()

		rrdb := newRedisClient(addr, nil)
		defer rrdb.Close()
		redisson := &redistest.Redisson{RDB: rrdb, Name: name, Owner: fmt.Sprintf("0b7e3c11-9d2a-4c5e-8f1b-redisson%04d:1", i), Lease: peerTTL}
		sub, err := redisson.Subscribe(ctx)
		if err != nil {
			return nil, err
		}
		defer sub.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				if err := redisson.LockOn(runCtx, sub); err != nil {
					noteErr(fmt.Errorf("redisson lock: %w", err))
					continue
				}
				critical(&theirs)
				if _, err := redisson.Unlock(context.WithoutCancel(runCtx)); err != nil {
					noteErr(fmt.Errorf("redisson unlock: %w", err))
				}
				pause(cfg.think)
			}
		}()
	}
	select {
	case <-time.After(cfg.warmup):
	case <-ctx.Done():
	}
	measure.Store(true)
	select {
	case <-time.After(cfg.mixed):
	case <-ctx.Done():
	}
	measure.Store(false)
	cancel()
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res.ours, res.theirs = ours.Load(), theirs.Load()
	res.overlaps, res.errors = overlaps.Load(), errs.Load()
	return res, nil
}
