package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// uncontendedResult holds the floor (PING RTT), the uncontended Lock+Unlock
// pair latencies and each library's design floor (shapes), measured
// interleaved in rounds, each series on its own client, so that machine noise
// hits all of them alike.
type uncontendedResult struct {
	rtt      durations // sorted
	pairs    map[string]durations
	shapes   map[string]durations // each library's round trips with empty scripts
	sent     map[string]sent
	numPairs map[string]int
	server   map[string]time.Duration // Redis execution time per pair
	cpu      map[string]time.Duration // this process's CPU per pair
	// Per library: Redis commands per pair, script-internal included
	// (INFO commandstats), Redis execution time per script call
	// (EVALSHA/EVAL usec over their calls) and Go heap allocations per
	// pair (testing.AllocsPerRun).
	redisCmds  map[string]float64
	perScript  map[string]time.Duration
	allocs     map[string]float64
	scriptCall map[string]float64 // script calls per pair
}

func runUncontended(ctx context.Context, cfg config, addr string, admin *redis.Client) (*uncontendedResult, error) {
	// One go-redis client for PING and one per library, so the hooks count
	// per library while the samples interleave.
	pingRdb := newRedisClient(addr, nil)
	defer pingRdb.Close()

	type entry struct {
		lib  library
		l    locker
		hook *counter
	}
	var entries []entry
	for _, lib := range libraries {
		hook := newCounter()
		rdb := newRedisClient(addr, hook)
		defer rdb.Close()
		newLocker, closeFn, err := lib.client(rdb)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", lib.name, err)
		}
		defer closeFn()
		l, err := newLocker("lockbench:uncontended:" + lib.name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", lib.name, err)
		}
		entries = append(entries, entry{lib, l, hook})
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
	ping := func() (time.Duration, error) {
		start := time.Now()
		err := pingRdb.Ping(ctx).Err()
		return time.Since(start), err
	}

	shapeRdb := newRedisClient(addr, nil)
	defer shapeRdb.Close()
	shape := func(name string) (time.Duration, error) {
		start := time.Now()
		err := shapes[name](ctx, shapeRdb)
		return time.Since(start), err
	}

	// Warm up: dial, load scripts (the first EVALSHA answers NOSCRIPT).
	for range 50 {
		if _, err := ping(); err != nil {
			return nil, err
		}
		for _, e := range entries {
			if _, err := pair(e.l); err != nil {
				return nil, fmt.Errorf("%s: %w", e.lib.name, err)
			}
			if _, err := shape(e.lib.name); err != nil {
				return nil, fmt.Errorf("%s's shape: %w", e.lib.name, err)
			}
		}
	}

	res := &uncontendedResult{
		pairs:      make(map[string]durations),
		shapes:     make(map[string]durations),
		sent:       make(map[string]sent),
		numPairs:   make(map[string]int),
		server:     make(map[string]time.Duration),
		cpu:        make(map[string]time.Duration),
		redisCmds:  make(map[string]float64),
		perScript:  make(map[string]time.Duration),
		allocs:     make(map[string]float64),
		scriptCall: make(map[string]float64),
	}

	// Latency: PINGs, pairs and shapes interleaved one by one, in a new
	// random order each round, so that noise on this machine hits every
	// series alike, and none always follows the same other one: what ran
	// just before changes how awake the processes are, and so the latency.
	type series struct {
		name    string
		samples int
		sample  func() (time.Duration, error)
		got     durations
		store   func(sorted durations)
	}
	all := []*series{{name: "PING", samples: cfg.pings, sample: ping,
		store: func(d durations) { res.rtt = d }}}
	for _, e := range entries {
		name := e.lib.name
		all = append(all,
			&series{name: name, samples: cfg.pairs,
				sample: func() (time.Duration, error) { return pair(e.l) },
				store:  func(d durations) { res.pairs[name] = d }},
			&series{name: name + "'s shape", samples: cfg.pairs,
				sample: func() (time.Duration, error) { return shape(name) },
				store:  func(d durations) { res.shapes[name] = d }})
	}
	n := max(cfg.pings, cfg.pairs)
	for i := range n {
		if i%64 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		for _, j := range rand.Perm(len(all)) {
			s := all[j]
			if i >= s.samples {
				continue
			}
			d, err := s.sample()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.name, err)
			}
			s.got = append(s.got, d)
		}
	}
	for _, s := range all {
		s.store(s.got.sorted())
	}

	// Commands and Redis execution time: one library at a time, so the
	// server-side commandstats deltas belong to it.
	batch := max(100, min(cfg.pairs, 1000))
	for _, e := range entries {
		s0, err := readCmdStats(ctx, admin)
		if err != nil {
			return nil, err
		}
		h0 := e.hook.snap()
		c0 := selfCPU()
		for range batch {
			if _, err := pair(e.l); err != nil {
				return nil, fmt.Errorf("%s: %w", e.lib.name, err)
			}
		}
		res.cpu[e.lib.name] = (selfCPU() - c0) / time.Duration(batch)
		h := e.hook.snap().sub(h0)
		s1, err := readCmdStats(ctx, admin)
		if err != nil {
			return nil, err
		}
		d := s1.sub(s0)
		res.numPairs[e.lib.name] = batch
		res.sent[e.lib.name] = measureSent(h, d)
		res.server[e.lib.name] = serverTime(h, d) / time.Duration(batch)
		res.redisCmds[e.lib.name] = float64(d.calls()) / float64(batch)
		if evals := d.evals(); evals > 0 {
			usec := d["evalsha#usec"] + d["eval#usec"] + d["evalsha_ro#usec"] + d["eval_ro#usec"]
			res.perScript[e.lib.name] = time.Duration(float64(usec) / float64(evals) * float64(time.Microsecond))
			res.scriptCall[e.lib.name] = float64(evals) / float64(batch)
		}
		// Allocations: testing.AllocsPerRun counts the process's heap
		// allocations (runtime MemStats.Mallocs) over the runs, with
		// GOMAXPROCS 1; nothing else of the harness runs meanwhile.
		var pairErr error
		res.allocs[e.lib.name] = testing.AllocsPerRun(batch, func() {
			if _, err := pair(e.l); err != nil && pairErr == nil {
				pairErr = err
			}
		})
		if pairErr != nil {
			return nil, fmt.Errorf("%s: %w", e.lib.name, pairErr)
		}
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

// emptyScript does nothing: with it, shapes time a library's round trips
// without the work its scripts do.
var emptyScript = redis.NewScript("return 0")

// shapes send, per library, the commands its uncontended Lock+Unlock sends,
// with the same keys and arguments, but with every script replaced by
// emptyScript: the floor of that design on this machine, as far as the
// scripts' work goes. lockwarden runs a script for each; the peers SET and
// run a script for the release.
var shapes = map[string]func(ctx context.Context, rdb *redis.Client) error{
	"lockwarden": func(ctx context.Context, rdb *redis.Client) error {
		const name = "lockbench:shape:lockwarden"
		const tag = "{" + name + "}"
		// An uncontended Lock of a new owner runs take.lua, with the lock's
		// hash, counter, queue and record of finished calls, and its Unlock
		// unlock.lua, with the hash and the release channel (see
		// pkg/redislock/scripts).
		const clientID = "6f1ed002-ab5d-4b2f-9c3a-1c8a2e3d4f5a"
		owner := clientID + ":" + newRequestID()
		// take.lua: owner, client clock, lease terms (the default 30s
		// watchdog lease).
		take := []string{name, "redisson_lock_token:" + tag, "lockwarden_lock_queue:" + tag, "lockwarden_lock_done:" + tag}
		if err := emptyScript.Run(ctx, rdb, take, owner, time.Now().UnixMicro(), "30000w").Err(); err != nil {
			return err
		}
		// unlock.lua: owner, the ownership's token and terms.
		return emptyScript.Run(ctx, rdb, []string{name, "redisson_lock__channel:" + tag}, owner, "1795458593061553 30000w").Err()
	},
	"redsync":       setThenScript("lockbench:shape:redsync"),
	"bsm/redislock": setThenScript("lockbench:shape:bsm"),
}

func setThenScript(key string) func(ctx context.Context, rdb *redis.Client) error {
	return func(ctx context.Context, rdb *redis.Client) error {
		const value = "Ksd8Xx1PqzS2tUeCfW9mLg=="
		// A plain SET PX, as the peers' SET NX PX finds the key gone after
		// a real release, while the empty script leaves it in place.
		if err := rdb.Set(ctx, key, value, peerTTL).Err(); err != nil {
			return err
		}
		return emptyScript.Run(ctx, rdb, []string{key}, value).Err()
	}
}

// newRequestID returns a random request ID, as lockwarden makes one for each
// acquire and release.
func newRequestID() string {
	var b [12]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}
