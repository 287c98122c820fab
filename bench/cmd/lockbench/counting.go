package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// How commands are counted.
//
// Redis 7.0 counts the commands a Lua script calls in both INFO stats
// total_commands_processed and INFO commandstats (probeScriptCounting checks
// this on the server at hand), so neither gives the commands clients sent.
// The benchmark therefore counts, for every library alike:
//
//   - client side, a go-redis hook on every client the library is given:
//     each command passed to Process, and each command of a pipeline (a
//     pipeline is one round trip);
//   - server side, the INFO commandstats deltas of the commands only a
//     pub/sub connection sends here (SUBSCRIBE, UNSUBSCRIBE, PSUBSCRIBE,
//     PUNSUBSCRIBE, PING), because go-redis writes those on the PubSub
//     connection without running hooks. The harness sends none of them
//     while a measurement window is open.
//
// The hook's EVALSHA+EVAL count is checked against the server's
// cmdstat_evalsha+cmdstat_eval delta (a script cannot call EVAL, so those are
// top level only); a mismatch is reported.

// counter is a go-redis hook that counts what a client sends.
type counter struct {
	cmds       atomic.Int64 // commands sent through Process or a pipeline
	roundTrips atomic.Int64 // Process calls plus pipeline executions
	pipelines  atomic.Int64
	evals      atomic.Int64 // EVALSHA + EVAL

	mu      sync.Mutex
	byName  map[string]int64
	record  bool // record pipeline events
	events  []pipeEvent
	singles []time.Time
}

type pipeEvent struct {
	start time.Time
	took  time.Duration
	size  int
}

func newCounter() *counter { return &counter{byName: make(map[string]int64)} }

func (c *counter) note(cmd redis.Cmder) {
	name := strings.ToLower(cmd.Name())
	c.cmds.Add(1)
	if name == "evalsha" || name == "eval" || name == "evalsha_ro" || name == "eval_ro" {
		c.evals.Add(1)
	}
	c.mu.Lock()
	c.byName[name]++
	c.mu.Unlock()
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.note(cmd)
		c.roundTrips.Add(1)
		c.mu.Lock()
		if c.record {
			c.singles = append(c.singles, time.Now())
		}
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.note(cmd)
		}
		c.roundTrips.Add(1)
		c.pipelines.Add(1)
		start := time.Now()
		err := next(ctx, cmds)
		c.mu.Lock()
		if c.record {
			c.events = append(c.events, pipeEvent{start: start, took: time.Since(start), size: len(cmds)})
		}
		c.mu.Unlock()
		return err
	}
}

// recordPipelines starts recording pipeline executions, dropping any
// recorded before.
func (c *counter) recordPipelines() {
	c.mu.Lock()
	c.record, c.events, c.singles = true, nil, nil
	c.mu.Unlock()
}

// stopRecording stops recording and returns the pipeline executions
// recorded since recordPipelines.
func (c *counter) stopRecording() []pipeEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.record = false
	return c.events
}

// snap is a copy of a counter's totals.
type snap struct {
	cmds, roundTrips, pipelines, evals int64
	byName                             map[string]int64
}

func (c *counter) snap() snap {
	s := snap{
		cmds: c.cmds.Load(), roundTrips: c.roundTrips.Load(),
		pipelines: c.pipelines.Load(), evals: c.evals.Load(),
		byName: make(map[string]int64),
	}
	c.mu.Lock()
	for k, v := range c.byName {
		s.byName[k] = v
	}
	c.mu.Unlock()
	return s
}

func (a snap) sub(b snap) snap {
	d := snap{
		cmds: a.cmds - b.cmds, roundTrips: a.roundTrips - b.roundTrips,
		pipelines: a.pipelines - b.pipelines, evals: a.evals - b.evals,
		byName: make(map[string]int64),
	}
	for k, v := range a.byName {
		if v-b.byName[k] != 0 {
			d.byName[k] = v - b.byName[k]
		}
	}
	return d
}

// cmdStats is INFO commandstats: calls per command name, and under
// "<name>#usec" the microseconds Redis spent in them (a script's time
// includes the commands it calls, which also have their own entries).
type cmdStats map[string]int64

func readCmdStats(ctx context.Context, admin *redis.Client) (cmdStats, error) {
	info, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	st := make(cmdStats)
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		name, fields, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		for _, f := range strings.Split(fields, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				st[name] = n
			}
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				st[name+"#usec"] = n
			}
		}
	}
	return st, nil
}

func (a cmdStats) sub(b cmdStats) cmdStats {
	d := make(cmdStats)
	for k, v := range a {
		if v-b[k] != 0 {
			d[k] = v - b[k]
		}
	}
	return d
}

// pubsubOnly are the commands that, in this benchmark, only a pub/sub
// connection sends, so no hook sees them.
var pubsubOnly = []string{"subscribe", "unsubscribe", "psubscribe", "punsubscribe", "ssubscribe", "sunsubscribe", "ping"}

func (d cmdStats) pubsub() int64 {
	var n int64
	for _, k := range pubsubOnly {
		n += d[k]
	}
	return n
}

// calls is the number of calls of every command, except INFO (which only
// the harness sends here, to read the counters).
func (d cmdStats) calls() int64 {
	var n int64
	for k, v := range d {
		if strings.Contains(k, "#") || k == "info" {
			continue
		}
		n += v
	}
	return n
}

func (d cmdStats) evals() int64 {
	return d["evalsha"] + d["eval"] + d["evalsha_ro"] + d["eval_ro"]
}

// serverTime is the time Redis spent executing the commands the clients sent
// (hook-counted), from commandstats usec. For a command name that scripts
// also call, only the hook-counted share of its time is taken.
func serverTime(hook snap, d cmdStats) time.Duration {
	var usec float64
	for name, n := range hook.byName {
		calls := d[name]
		if calls <= 0 {
			continue
		}
		share := min(1, float64(n)/float64(calls))
		usec += share * float64(d[name+"#usec"])
	}
	return time.Duration(usec * float64(time.Microsecond))
}

// sent is what one window's clients sent: hook-counted plus pub/sub.
type sent struct {
	hook   snap
	server cmdStats
	pubsub int64
	total  int64
}

func measureSent(hook snap, server cmdStats) sent {
	s := sent{hook: hook, server: server, pubsub: server.pubsub()}
	s.total = hook.cmds + s.pubsub
	return s
}

// mix formats the per-command breakdown, per unit (acquisition, pair).
func (s sent) mix(per float64) string {
	type kv struct {
		k string
		v int64
	}
	var kvs []kv
	for k, v := range s.hook.byName {
		kvs = append(kvs, kv{k, v})
	}
	for _, k := range pubsubOnly {
		if v := s.server[k]; v != 0 {
			kvs = append(kvs, kv{k + "(pubsub)", v})
		}
	}
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].v > kvs[j].v || kvs[i].v == kvs[j].v && kvs[i].k < kvs[j].k })
	var parts []string
	for _, e := range kvs {
		parts = append(parts, fmt.Sprintf("%s %.2f", e.k, float64(e.v)/per))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// probeResult is what the server counts for a command called inside a script.
type probeResult struct {
	cmdstatInner int64 // cmdstat_set delta for one EVAL that calls SET once
	totalDelta   int64 // total_commands_processed delta for that EVAL
}

func probeScriptCounting(ctx context.Context, admin *redis.Client) (probeResult, error) {
	var p probeResult
	totals := func() (int64, error) {
		info, err := admin.Info(ctx, "stats").Result()
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(infoField(info, "total_commands_processed"), 10, 64)
	}
	before, err := readCmdStats(ctx, admin)
	if err != nil {
		return p, err
	}
	t0, err := totals()
	if err != nil {
		return p, err
	}
	if err := admin.Eval(ctx, "redis.call('set', KEYS[1], 'x') return 1", []string{"lockbench:probe"}).Err(); err != nil {
		return p, err
	}
	t1, err := totals()
	if err != nil {
		return p, err
	}
	after, err := readCmdStats(ctx, admin)
	if err != nil {
		return p, err
	}
	// Between the two INFO stats replies the server also counted the first
	// INFO itself (a command is counted once it has run).
	p.totalDelta = t1 - t0 - 1
	p.cmdstatInner = after["set"] - before["set"]
	return p, admin.Del(ctx, "lockbench:probe").Err()
}

func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}
