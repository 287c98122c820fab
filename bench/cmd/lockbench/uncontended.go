package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// uncontendedResult holds the floor (PING RTT) and the uncontended
// Lock+Unlock pair latencies, measured interleaved in rounds on one client so
// that machine noise hits all of them alike.
type uncontendedResult struct {
	rtt      durations // sorted
	pairs    map[string]durations
	sent     map[string]sent
	numPairs map[string]int
}

func runUncontended(ctx context.Context, cfg config, addr string, admin *redis.Client) (*uncontendedResult, error) {
	hook := newCounter()
	rdb := newRedisClient(addr, hook)
	defer rdb.Close()

	type entry struct {
		lib library
		l   locker
	}
	var entries []entry
	for _, lib := range libraries {
		newLocker, closeFn, err := lib.client(rdb)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", lib.name, err)
		}
		defer closeFn()
		l, err := newLocker("lockbench:uncontended:" + lib.name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", lib.name, err)
		}
		entries = append(entries, entry{lib, l})
	}

	pair := func(l locker) (time.Duration, error) {
		start := time.Now()
		if _, err := l.lock(ctx); err != nil {
			return 0, err
		}
		if err := l.unlock(ctx); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}

	// Warm up: dial, load scripts (first EVALSHA answers NOSCRIPT).
	for range 50 {
		if err := rdb.Ping(ctx).Err(); err != nil {
			return nil, err
		}
		for _, e := range entries {
			if _, err := pair(e.l); err != nil {
				return nil, fmt.Errorf("%s: %w", e.lib.name, err)
			}
		}
	}

	res := &uncontendedResult{
		pairs:    make(map[string]durations),
		sent:     make(map[string]sent),
		numPairs: make(map[string]int),
	}
	hookTotals := make(map[string]snap)
	serverTotals := make(map[string]cmdStats)
	rounds := max(1, cfg.uncontendedRounds)
	pingsPer := max(1, cfg.pings/rounds)
	pairsPer := max(1, cfg.pairs/rounds)
	for r := range rounds {
		for range pingsPer {
			start := time.Now()
			if err := rdb.Ping(ctx).Err(); err != nil {
				return nil, err
			}
			res.rtt = append(res.rtt, time.Since(start))
		}
		for i := range entries {
			e := entries[(i+r)%len(entries)] // rotate the order each round
			s0, err := readCmdStats(ctx, admin)
			if err != nil {
				return nil, err
			}
			h0 := hook.snap()
			for range pairsPer {
				d, err := pair(e.l)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", e.lib.name, err)
				}
				res.pairs[e.lib.name] = append(res.pairs[e.lib.name], d)
			}
			h1 := hook.snap()
			s1, err := readCmdStats(ctx, admin)
			if err != nil {
				return nil, err
			}
			res.numPairs[e.lib.name] += pairsPer
			hookTotals[e.lib.name] = addSnap(hookTotals[e.lib.name], h1.sub(h0))
			serverTotals[e.lib.name] = addStats(serverTotals[e.lib.name], s1.sub(s0))
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	res.rtt = res.rtt.sorted()
	for name, d := range res.pairs {
		res.pairs[name] = d.sorted()
		res.sent[name] = measureSent(hookTotals[name], serverTotals[name])
	}
	return res, nil
}

func addSnap(a, b snap) snap {
	out := snap{
		cmds: a.cmds + b.cmds, roundTrips: a.roundTrips + b.roundTrips,
		pipelines: a.pipelines + b.pipelines, evals: a.evals + b.evals,
		byName: make(map[string]int64),
	}
	for k, v := range a.byName {
		out.byName[k] += v
	}
	for k, v := range b.byName {
		out.byName[k] += v
	}
	return out
}

func addStats(a, b cmdStats) cmdStats {
	out := make(cmdStats)
	for k, v := range a {
		out[k] += v
	}
	for k, v := range b {
		out[k] += v
	}
	return out
}
