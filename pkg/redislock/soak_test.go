package redislock_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// The soak runs soakProcesses copies of the test binary, each with
// soakClients lock clients, all taking soakLocks locks at random, while the
// test injects faults. `make soak` runs it longer through
// envSoakAcquisitions.
const (
	envSoakChild        = "REDISLOCK_TEST_SOAK_CHILD" // a soakConfig, as JSON
	envSoakAcquisitions = "LOCKWARDEN_SOAK_ACQUISITIONS"
	soakProcesses       = 8
	soakClients         = 4
	soakLocks           = 16
	soakLease           = 2 * time.Second
	soakDefaultTarget   = 40_000
	soakWait            = 5 * time.Second
	// soakWaitBound is the longest a TryLock(soakWait) may take: the wait,
	// one Redis call in flight when it ends with go-redis's own retries
	// (4 × its 3s read timeout), the lock client's resolve window (its
	// QueueTTL), and the leave that takes it out of the queue.
	soakWaitBound     = soakWait + 4*3*time.Second + soakQueueTTL + soakRetryFallback
	soakRetryFallback = 200 * time.Millisecond
	soakQueueTTL      = 5 * soakRetryFallback
	soakUser          = "locks"
	soakPassword      = "soak-password"
)

// soakConfig tells one soak process where to work and who it is.
type soakConfig struct {
	LockAddr     string // the lock Redis, through this process's proxy
	CheckerAddr  string
	Process      int
	Incarnation  int // how many times this process has been started
	WorkerOffset int
}

// The checker lives in a Redis of its own that no fault touches, and plays
// the protected resource. For each lock it records who is inside the
// critical section and the highest fencing token it has accepted; a holder
// announces itself on entry (which raises the token, like a first write),
// writes, and leaves. The test records in soak:procs when it pauses
// (pauses:<p>, frozen:<p>) or kills (inc:<p>) a process, so that finding a
// frozen or dead holder still inside is told apart from a real overlap.
//
// KEYS: soak:in:<lock>, soak:token:<lock>, soak:procs, soak:stats, and
// soak:timeline, where violations are logged after the faults before them.
var (
	checkerEnter = redis.NewScript(`
local holder, token, proc, inc = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
redis.call('hincrby', KEYS[4], 'acquisitions', 1)
local highest = redis.call('get', KEYS[2]) or '0'
if token < tonumber(highest) then
  -- A token below one the resource has seen: fencing refuses the holder.
  -- Only a holder paused since it asked for the lock (ARGV[5] is its
  -- process's pause count then) may come this late; any other is an
  -- overlap the lease should have prevented.
  local pauses = redis.call('hget', KEYS[3], 'pauses:' .. proc) or '0'
  if pauses ~= ARGV[5] or redis.call('hget', KEYS[3], 'frozen:' .. proc) == '1' then
    redis.call('hincrby', KEYS[4], 'paused holders refused', 1)
  else
    redis.call('hincrby', KEYS[4], 'overlaps', 1)
    redis.call('rpush', KEYS[5], 'overlap: ' .. holder .. ' entered with ' .. ARGV[2] .. ', after ' .. highest)
  end
  return 0
end
if redis.call('exists', KEYS[1]) == 1 then
  local o = redis.call('hmget', KEYS[1], 'proc', 'inc', 'pauses')
  local procInc = redis.call('hget', KEYS[3], 'inc:' .. o[1])
  local procPauses = redis.call('hget', KEYS[3], 'pauses:' .. o[1]) or '0'
  local frozen = redis.call('hget', KEYS[3], 'frozen:' .. o[1])
  if procInc ~= o[2] then
    redis.call('hincrby', KEYS[4], 'dead holders replaced', 1)
  elseif procPauses ~= o[3] or frozen == '1' then
    redis.call('hincrby', KEYS[4], 'paused holders overlapped', 1)
  else
    redis.call('hincrby', KEYS[4], 'overlaps', 1)
    redis.call('rpush', KEYS[5], 'overlap: ' .. holder .. ' entered while ' ..
      redis.call('hget', KEYS[1], 'holder') .. ' was inside')
  end
end
if token == tonumber(highest) then
  redis.call('hincrby', KEYS[4], 'token regressions', 1)
  redis.call('rpush', KEYS[5], 'token regression: ' .. holder .. ' has ' .. ARGV[2] .. ', as the last holder had')
end
redis.call('set', KEYS[2], ARGV[2])
redis.call('hset', KEYS[1], 'holder', holder, 'proc', proc, 'inc', inc,
  'pauses', redis.call('hget', KEYS[3], 'pauses:' .. proc) or '0')
return 1`)
	checkerWrite = redis.NewScript(`
local holder, token, proc, pauses, hold = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local highest = redis.call('get', KEYS[2]) or '0'
if tonumber(token) < tonumber(highest) then
  -- Fencing refuses the write. The holder checked that its Hold still held
  -- just before it: unless its process was paused since it asked for the
  -- lock, or it is not a Hold (ARGV[5] '0': the Redisson-script worker),
  -- the Hold outlived its lock without its Context ending.
  local now = redis.call('hget', KEYS[3], 'pauses:' .. proc) or '0'
  if hold ~= '1' or now ~= pauses or redis.call('hget', KEYS[3], 'frozen:' .. proc) == '1' then
    redis.call('hincrby', KEYS[4], 'stale writes refused', 1)
  else
    redis.call('hincrby', KEYS[4], 'holds outliving their lock', 1)
    redis.call('rpush', KEYS[5], 'hold outliving its lock: ' .. holder .. ' wrote with ' .. token .. ', after ' .. highest)
  end
  return 0
end
redis.call('hincrby', KEYS[4], 'writes', 1)
if redis.call('hget', KEYS[1], 'holder') ~= ARGV[1] then
  redis.call('hincrby', KEYS[4], 'stale writes accepted', 1)
  redis.call('rpush', KEYS[5], 'stale write accepted: ' .. ARGV[1] .. ' with ' .. ARGV[2])
end
redis.call('set', KEYS[2], ARGV[2])
return 1`)
	checkerLeave = redis.NewScript(`
if redis.call('hget', KEYS[1], 'holder') == ARGV[1] then
  redis.call('del', KEYS[1])
end
return 1`)
)

func checkerKeys(lock string) []string {
	return []string{"soak:in:" + lock, "soak:token:" + lock, "soak:procs", "soak:stats", "soak:timeline"}
}

// soakViolations are the checker's counters that must stay 0.
var soakViolations = []string{"overlaps", "token regressions", "stale writes accepted", "holds outliving their lock",
	"waits past their bound", "holds lost to a slow Unlock"}

// TestSoak runs 8 processes of 4 lock clients each over 16 locks until they
// have made at least 40,000 acquisitions (`make soak`: 1,000,000), while
// faults strike at random: the lock Redis paused, or crashed and restarted
// from its append-only file; one process's network cut or slowed, or its
// replies lost after Redis ran the commands; one process killed (and started
// again), or paused past its lease. Half the acquisitions are re-entered at
// once by the same owner from a second goroutine and a second Client, whose
// lease terms differ for one client of each process (the re-entry is then
// refused); every other process has a worker running Redisson's scripts;
// one client of each process stalls some of its Unlocks for longer than its
// lease while it holds another lock, which a long holder keeps and writes
// under; and plain listeners sit on every lock's release channel. The
// workers connect as a Redis user with only MinimalACL. The checker must see
// no overlapping holds (but for a paused or dead holder, which only fencing
// can stop: a paused holder that comes back is refused by its token), no
// fencing token that fails to rise, no stale write accepted, no write by a
// Hold whose lock had ended without its Context ending (fencing refuses it),
// no hold lost while no fault struck, and no TryLock past its bound; no
// process may grow or leak goroutines, and the race detector must stay
// quiet.
func TestSoak(t *testing.T) {
	target := soakDefaultTarget
	if v := os.Getenv(envSoakAcquisitions); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", envSoakAcquisitions, v)
		}
		target = n
	}
	// appendfsync always: a crash loses no acknowledged lock (see
	// TestRedisRestartWithAOF for everysec).
	// The workers connect as a user with only redislock.MinimalACL, which
	// the server's own configuration keeps across its restarts.
	aclUser := append([]string{"--user", soakUser, "on", ">" + soakPassword}, strings.Fields(redislock.MinimalACL)...)
	lockRedis := redistest.Start(t, append([]string{"--appendonly", "yes", "--appendfsync", "always"}, aclUser...)...)
	checker := redistest.Start(t)
	admin := checker.Client(t)
	ctx := context.Background()

	s := &soak{t: t, lockRedis: lockRedis, admin: admin, checkerAddr: checker.Addr, faults: make(map[string]int)}
	// Plain listeners on every lock's release channel, as the controller
	// and monitoring tools are: they must not turn the hand-over off.
	var channels []string
	for i := range soakLocks {
		channels = append(channels, fmt.Sprintf("redisson_lock__channel:{soak:lock:%d}", i))
	}
	listener := lockRedis.Client(t).Subscribe(ctx, channels...)
	t.Cleanup(func() { _ = listener.Close() })
	for p := range soakProcesses {
		s.procs = append(s.procs, &soakProc{index: p, proxy: redistest.StartProxy(t, lockRedis.Addr)})
		if err := s.start(s.procs[p]); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(s.killAll)

	stopFaults := make(chan struct{})
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		s.injectFaults(stopFaults)
	}()
	started := time.Now()
	progress, lastCount := started, 0
	for {
		n, err := admin.HGet(ctx, "soak:stats", "acquisitions").Int()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		if n >= target {
			break
		}
		if n > lastCount {
			progress, lastCount = time.Now(), n
		} else if time.Since(progress) > 2*time.Minute { // only a hung soak stalls this long
			t.Fatalf("no acquisition for 2 minutes, at %d of %d", n, target)
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(stopFaults)
	<-faultsDone
	s.stopAll()

	stats, err := admin.HGetAll(ctx, "soak:stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("soak: %s acquisitions in %v by %d processes x %d clients over %d locks", stats["acquisitions"],
		time.Since(started).Round(time.Second), soakProcesses, soakClients, soakLocks)
	t.Logf("faults: %s", s.faultSummary())
	t.Logf("checker: %v", stats)
	for _, p := range s.procs {
		t.Logf("process %d (started %d times): %s", p.index, p.incarnation, p.report)
	}
	failed := false
	for _, v := range soakViolations {
		if n, _ := strconv.Atoi(stats[v]); n != 0 {
			t.Errorf("checker counted %d %s", n, v)
			failed = true
		}
	}
	if failed {
		timeline, _ := admin.LRange(ctx, "soak:timeline", 0, -1).Result()
		t.Logf("timeline of faults and violations:\n%s", strings.Join(timeline, "\n"))
	}
}

// soak is the test side: the processes, and the faults done to them.
type soak struct {
	t           *testing.T
	lockRedis   *redistest.Server
	admin       *redis.Client
	checkerAddr string
	procs       []*soakProc

	mu     sync.Mutex
	faults map[string]int
}

type soakProc struct {
	index       int
	incarnation int
	proxy       *redistest.Proxy
	cmd         *exec.Cmd
	exited      chan struct{}
	report      string // its final DONE line
}

// start starts (or restarts) process p; its incarnation is recorded in the
// checker first, so holders of an earlier incarnation count as dead.
func (s *soak) start(p *soakProc) error {
	p.incarnation++
	if err := s.admin.HSet(context.Background(), "soak:procs", fmt.Sprintf("inc:%d", p.index), p.incarnation).Err(); err != nil {
		return err
	}
	cfg, _ := json.Marshal(soakConfig{
		LockAddr: p.proxy.Addr, CheckerAddr: s.checkerAddr,
		Process: p.index, Incarnation: p.incarnation, WorkerOffset: p.index * soakClients,
	})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envSoakChild+"="+string(cfg))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			if line := scanner.Text(); strings.HasPrefix(line, "DONE ") {
				s.mu.Lock()
				p.report = strings.TrimPrefix(line, "DONE ")
				s.mu.Unlock()
			}
		}
		_ = cmd.Wait()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	return nil
}

// killAll is the cleanup for a failed test.
func (s *soak) killAll() {
	for _, p := range s.procs {
		if p.cmd != nil {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
}

// stopAll asks every process to finish (SIGTERM) and checks that each
// exits cleanly: its workers stopped, its clients closed, no goroutine left
// and no race reported.
func (s *soak) stopAll() {
	t := s.t
	for _, p := range s.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range s.procs {
		select {
		case <-p.exited:
		case <-time.After(time.Minute):
			t.Fatalf("process %d did not stop", p.index)
		}
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("process %d exited with %d", p.index, code)
		}
		if p.report == "" {
			t.Errorf("process %d gave no report", p.index)
		}
	}
}

// soakFault is one fault: it strikes, lasts, and is undone before it returns.
type soakFault struct {
	name   string
	strike func(s *soak, p *soakProc, r *rand.Rand)
}

var soakFaults = []soakFault{
	{"lock Redis paused", func(s *soak, _ *soakProc, r *rand.Rand) {
		must(s.t, s.lockRedis.Pause())
		time.Sleep(randDuration(r, soakLease/10, 3*soakLease/2))
		must(s.t, s.lockRedis.Resume())
	}},
	{"lock Redis crashed and restarted", func(s *soak, _ *soakProc, r *rand.Rand) {
		s.lockRedis.Stop()
		time.Sleep(randDuration(r, 0, soakLease))
		must(s.t, s.lockRedis.Restart())
	}},
	{"network cut", func(s *soak, p *soakProc, r *rand.Rand) {
		p.proxy.Cut()
		time.Sleep(randDuration(r, soakLease/4, 3*soakLease/2))
		p.proxy.Heal()
	}},
	{"network slowed", func(s *soak, p *soakProc, r *rand.Rand) {
		p.proxy.Delay(randDuration(r, 10*time.Millisecond, soakLease/2))
		time.Sleep(randDuration(r, soakLease/4, soakLease))
		p.proxy.Heal()
	}},
	{"replies lost", func(s *soak, p *soakProc, r *rand.Rand) {
		// Commands run, but their replies are lost and the connections
		// reset: go-redis and the lock client send them again.
		p.proxy.LoseRepliesAtRandom(0.05 + 0.25*r.Float64())
		time.Sleep(randDuration(r, soakLease/4, soakLease))
		p.proxy.Heal()
	}},
	{"process killed and restarted", func(s *soak, p *soakProc, r *rand.Rand) {
		_ = p.cmd.Process.Kill()
		<-p.exited
		must(s.t, s.start(p))
	}},
	{"process paused past its lease", func(s *soak, p *soakProc, r *rand.Rand) {
		ctx := context.Background()
		// Marked frozen before the stop, and counted again after it, so
		// every holder that was inside while stopped is known as paused.
		must(s.t, s.admin.HSet(ctx, "soak:procs", fmt.Sprintf("frozen:%d", p.index), 1).Err())
		must(s.t, s.admin.HIncrBy(ctx, "soak:procs", fmt.Sprintf("pauses:%d", p.index), 1).Err())
		must(s.t, p.cmd.Process.Signal(syscall.SIGSTOP))
		time.Sleep(randDuration(r, soakLease+soakLease/4, 2*soakLease))
		must(s.t, p.cmd.Process.Signal(syscall.SIGCONT))
		must(s.t, s.admin.HIncrBy(ctx, "soak:procs", fmt.Sprintf("pauses:%d", p.index), 1).Err())
		must(s.t, s.admin.HSet(ctx, "soak:procs", fmt.Sprintf("frozen:%d", p.index), 0).Err())
	}},
}

// injectFaults strikes a random fault at a random process every so often
// until stop closes. Faults do not overlap, and each is undone before the
// next.
func (s *soak) injectFaults(stop <-chan struct{}) {
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	for {
		select {
		case <-stop:
			return
		case <-time.After(randDuration(r, soakLease/4, 2*soakLease)):
		}
		f, p := soakFaults[r.IntN(len(soakFaults))], s.procs[r.IntN(len(s.procs))]
		ctx := context.Background()
		must(s.t, s.admin.RPush(ctx, "soak:timeline", fmt.Sprintf("%s: %s (process %d)",
			time.Now().Format("15:04:05.000"), f.name, p.index)).Err())
		// While a fault strikes, and a lease after, a hold may be lost.
		must(s.t, s.admin.HSet(ctx, "soak:procs", "faulting", 1).Err())
		f.strike(s, p, r)
		must(s.t, s.admin.HSet(ctx, "soak:procs", "faulting", 0, "fault ended", time.Now().UnixMilli()).Err())
		s.mu.Lock()
		s.faults[f.name]++
		s.mu.Unlock()
	}
}

func (s *soak) faultSummary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for _, f := range soakFaults {
		parts = append(parts, fmt.Sprintf("%s %d", f.name, s.faults[f.name]))
	}
	return strings.Join(parts, ", ")
}

func randDuration(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Error(err) // Fatal is not allowed outside the test goroutine
	}
}

// runSoakChild is one soak process: soakClients clients, each with one
// worker taking random locks, entering the checker's critical section,
// writing with its fencing token and leaving, until SIGTERM. Its last line
// reports what it did and its goroutine counts.
func runSoakChild(raw string) int {
	var cfg soakConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "soak child:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	checker := redis.NewClient(&redis.Options{Addr: cfg.CheckerAddr})

	var (
		w       = soakWorker{cfg: cfg, checker: checker}
		wg      sync.WaitGroup
		rdbs    []*redis.Client
		clients []*redislock.Client
	)
	for i := range soakClients {
		rdb := redis.NewClient(&redis.Options{Addr: cfg.LockAddr, Username: soakUser, Password: soakPassword})
		rdbs = append(rdbs, rdb)
		opts := redislock.Options{WatchdogLease: soakLease, RetryFallback: soakRetryFallback, QueueTTL: soakQueueTTL}
		switch i {
		case 0:
			// It stalls one Unlock in 50 for longer than its lease.
			rdb.AddHook(&slowUnlocks{every: 50, stall: soakLease * 3 / 2})
		case 1:
			// Other lease terms: its worker's re-entries through the
			// neighbour client, and the previous worker's through it, are
			// refused.
			opts.WatchdogLease = soakLease + time.Second
		}
		c, err := redislock.New(rdb, opts)
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak child:", err)
			return 2
		}
		clients = append(clients, c)
	}
	// Beside the stalled Unlocks of client 0, its long holder keeps a lock
	// for three leases at a time, renewed by the watchdog, and writes under
	// it: its hold may be lost only to a fault.
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.holdLong(ctx, clients[0], cfg.WorkerOffset)
	}()
	for i, c := range clients {
		if i == soakClients-1 && cfg.Process%2 == 0 {
			// In every other process, the last worker runs Redisson's
			// scripts instead, through the same faults.
			rdb := redis.NewClient(&redis.Options{Addr: cfg.LockAddr})
			rdbs = append(rdbs, rdb)
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.runRedisson(ctx, rdb, cfg.WorkerOffset+i)
			}()
			continue
		}
		// Each worker's neighbour client re-enters its holds for the same
		// owner: one owner from two Clients.
		neighbour := clients[(i+1)%len(clients)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx, c, neighbour, cfg.WorkerOffset+i)
		}()
	}

	// Goroutines are counted once the workers have settled in, and again
	// at the end: faults must not make them grow.
	var early, late, peak int
	sample := time.NewTicker(250 * time.Millisecond)
	defer sample.Stop()
	settled := time.After(2 * time.Second)
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case <-settled:
			early = runtime.NumGoroutine()
		case <-sample.C:
			late = runtime.NumGoroutine()
			peak = max(peak, late)
		}
	}
	wg.Wait()
	for _, c := range clients {
		_ = c.Close()
	}
	for _, rdb := range rdbs {
		_ = rdb.Close()
	}
	_ = checker.Close()
	stop()
	leak := "none"
	if err := goleak.Find(); err != nil {
		leak = err.Error()
	}
	fmt.Printf("DONE acquisitions=%d (Redisson's scripts %d, long holds %d) re-entries refused for other terms=%d lock-errors=%v goroutines early=%d late=%d peak=%d leaked=%s\n",
		w.acquisitions.Load(), w.redissonAcquisitions.Load(), w.longHolds.Load(), w.refusedTerms.Load(), w.errorSummary(), early, late, peak, leak)
	if leak != "none" || (early > 0 && late > early+2*soakClients) {
		return 1
	}
	return 0
}

// soakWorker is the work of one soak process's workers.
type soakWorker struct {
	cfg                  soakConfig
	checker              *redis.Client
	acquisitions         atomic.Int64
	redissonAcquisitions atomic.Int64 // by the worker running Redisson's scripts
	longHolds            atomic.Int64 // by the long holder
	refusedTerms         atomic.Int64 // re-entries refused with ErrLeaseMismatch

	mu     sync.Mutex
	errors map[string]int // Lock and Unlock errors, by kind
}

// run takes random locks until ctx ends. Each acquisition enters the
// checker, writes one to three times while the hold lasts, and leaves before
// unlocking. Every other acquisition is re-entered at the same time, for the
// same owner, from a second goroutine on this client and from a third on
// the neighbour client: concurrent calls by one owner, which must share the
// hold and never free it early.
func (w *soakWorker) run(ctx context.Context, c, neighbour *redislock.Client, worker int) {
	r := rand.New(rand.NewPCG(uint64(worker), uint64(w.cfg.Incarnation)))
	mutexes := make(map[string][2]*redislock.Mutex)
	for n := 0; ctx.Err() == nil; n++ {
		name := fmt.Sprintf("soak:lock:%d", r.IntN(soakLocks))
		m, ok := mutexes[name]
		if !ok {
			own, _ := c.NewMutex(name, nil)
			other, _ := neighbour.NewMutex(name, nil)
			m = [2]*redislock.Mutex{own, other}
			mutexes[name] = m
		}
		pauses, err := w.checker.HGet(ctx, "soak:procs", fmt.Sprintf("pauses:%d", w.cfg.Process)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			w.noteError("checker", err)
			continue
		}
		asked := time.Now()
		hold, err := m[0].TryLock(ctx, soakWait)
		if took := time.Since(asked); took > soakWaitBound {
			w.countViolation("waits past their bound", fmt.Sprintf("TryLock(%v) took %v", soakWait, took))
		}
		if err != nil {
			if ctx.Err() == nil {
				w.noteError("lock", err)
				time.Sleep(20 * time.Millisecond) // Redis may be down
			}
			continue
		}
		w.acquisitions.Add(1)
		holder := fmt.Sprintf("%d.%d.%d.%d", w.cfg.Process, w.cfg.Incarnation, worker, n)
		var reentries sync.WaitGroup
		if n%2 == 0 {
			for _, mu := range m {
				reentries.Add(1)
				held := time.Duration(r.IntN(200)) * time.Microsecond
				go func() {
					defer reentries.Done()
					w.reenter(hold, mu, held)
				}()
			}
		}
		w.critical(hold, name, holder, pauses, 1+r.IntN(3))
		reentries.Wait()
		w.unlock(hold)
	}
}

// runRedisson is a worker that runs Redisson's own scripts, with a fencing
// token taken as Redisson's RFencedLock takes one, and a fixed lease: it
// must exclude and be excluded by the lockwarden workers, and get turns.
func (w *soakWorker) runRedisson(ctx context.Context, rdb *redis.Client, worker int) {
	r := rand.New(rand.NewPCG(uint64(worker), uint64(w.cfg.Incarnation)))
	for n := 0; ctx.Err() == nil; n++ {
		name := fmt.Sprintf("soak:lock:%d", r.IntN(soakLocks))
		redisson := &redistest.Redisson{RDB: rdb, Name: name, Lease: soakLease,
			Owner: fmt.Sprintf("redisson-%d-%d:%d", w.cfg.Process, w.cfg.Incarnation, worker)}
		pauses, err := w.checker.HGet(ctx, "soak:procs", fmt.Sprintf("pauses:%d", w.cfg.Process)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			w.noteError("checker", err)
			continue
		}
		lockCtx, cancel := context.WithTimeout(ctx, soakWait)
		token, acquired, err := redisson.FencedLock(lockCtx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.noteError("redisson lock", err)
				time.Sleep(20 * time.Millisecond)
			}
			continue
		}
		w.acquisitions.Add(1)
		w.redissonAcquisitions.Add(1)
		holder := fmt.Sprintf("%d.%d.%d.%d", w.cfg.Process, w.cfg.Incarnation, worker, n)
		// The lease is fixed: work only while it surely lasts.
		valid := func() bool { return time.Since(acquired) < soakLease*9/10 }
		w.enter(token, valid, false, name, holder, pauses, 1+r.IntN(3))
		if _, err := redisson.Unlock(context.Background()); err != nil {
			w.noteError("redisson unlock", err)
		}
	}
}

// reenter takes the lock again for hold's owner, holds the re-entry for
// held, and unlocks it.
func (w *soakWorker) reenter(hold *redislock.Hold, m *redislock.Mutex, held time.Duration) {
	ctx, cancel := context.WithTimeout(redislock.WithHold(context.Background(), hold), soakWait)
	defer cancel()
	again, err := m.TryLock(ctx, 0)
	switch {
	case errors.Is(err, redislock.ErrLeaseMismatch):
		w.refusedTerms.Add(1) // the neighbour client's terms differ
		return
	case err != nil:
		if !errors.Is(err, redislock.ErrWaitTimeout) { // a lost hold cannot be re-entered
			w.noteError("re-entry", err)
		}
		return
	}
	switch {
	case again.Token() < hold.Token():
		w.countViolation("token regressions", fmt.Sprintf("a re-entry of %s got token %d, below its %d", hold.Owner(), again.Token(), hold.Token()))
	case again.Token() > hold.Token() && hold.Err() == nil:
		// A new ownership of the same owner is right only once the first
		// one has ended (its lease ran out, and the Lock took the lock
		// anew): two that both count as held overlap.
		w.countViolation("overlaps", fmt.Sprintf("%s holds with token %d and %d at once", hold.Owner(), hold.Token(), again.Token()))
	}
	time.Sleep(held)
	w.unlock(again)
}

// unlock releases a hold. An Unlock that fails for want of Redis is retried
// with the same Hold, which resends the same request: Redis applies it at
// most once. A last Unlock that failed ends the hold anyway, and the retry
// then reports ErrNotHeld.
func (w *soakWorker) unlock(hold *redislock.Hold) (released bool) {
	for range 100 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := hold.Unlock(ctx)
		cancel()
		if err == nil {
			return true
		}
		w.noteError("unlock", err)
		if !errors.Is(err, redislock.ErrUnavailable) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// countViolation counts a violation the worker saw itself in the checker.
func (w *soakWorker) countViolation(kind, what string) {
	ctx := context.Background()
	if err := w.checker.HIncrBy(ctx, "soak:stats", kind, 1).Err(); err != nil {
		w.noteError("checker", err)
	}
	_ = w.checker.RPush(ctx, "soak:timeline", kind+": "+what).Err()
}

// critical is the guarded work: the checker calls go to a Redis that no
// fault touches, and each is made only while the hold lasts.
func (w *soakWorker) critical(hold *redislock.Hold, name, holder, pauses string, writes int) {
	w.enter(hold.Token(), func() bool { return hold.Err() == nil }, true, name, holder, pauses, writes)
}

// enter is the guarded work of a holder with token, for as long as valid
// says it holds the lock; isHold tells a Hold's work from the
// Redisson-script worker's.
func (w *soakWorker) enter(token int64, valid func() bool, isHold bool, name, holder, pauses string, writes int) {
	w.enterFor(token, valid, isHold, name, holder, pauses, writes, 0)
}

// enterFor is enter with a pause between writes.
func (w *soakWorker) enterFor(token int64, valid func() bool, isHold bool, name, holder, pauses string, writes int, gap time.Duration) {
	ctx := context.Background()
	keys := checkerKeys(name)
	if !valid() {
		return
	}
	if pauses == "" {
		pauses = "0"
	}
	args := []any{holder, token, w.cfg.Process, w.cfg.Incarnation, pauses}
	entered, err := checkerEnter.Run(ctx, w.checker, keys, args...).Int()
	if err != nil || entered == 0 {
		if err != nil {
			w.noteError("checker", err)
		}
		return
	}
	hold := "0"
	if isHold {
		hold = "1"
	}
	for i := range writes {
		if i > 0 {
			time.Sleep(gap)
		}
		if !valid() {
			break
		}
		if err := checkerWrite.Run(ctx, w.checker, keys, holder, token, w.cfg.Process, pauses, hold).Err(); err != nil {
			w.noteError("checker", err)
		}
	}
	if err := checkerLeave.Run(ctx, w.checker, keys, holder).Err(); err != nil {
		w.noteError("checker", err)
	}
}

// noteError counts err under its typed kind.
func (w *soakWorker) noteError(op string, err error) {
	kind := "other"
	for _, typed := range []error{redislock.ErrWaitTimeout, redislock.ErrUnavailable, redislock.ErrNotOwner, redislock.ErrNotHeld, redislock.ErrLeaseLost, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, typed) {
			kind = typed.Error()
			break
		}
	}
	var netErr net.Error
	if kind == "other" && (errors.Is(err, io.EOF) || errors.As(err, &netErr)) {
		kind = "connection lost" // the Redisson-script worker's, under faults
	}
	if kind == "other" {
		fmt.Fprintf(os.Stderr, "soak child: %s: %v\n", op, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.errors == nil {
		w.errors = make(map[string]int)
	}
	w.errors[op+": "+kind]++
}

func (w *soakWorker) errorSummary() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.errors
}

// holdLong keeps the lock soak:long for three leases at a time, on the
// client whose Unlocks stall, writing under it every tenth of a lease while
// it holds; the long holders of all processes take turns. The hold may end
// only when a fault struck in the last two leases: the watchdog must keep
// it through the stalled Unlocks beside it.
func (w *soakWorker) holdLong(ctx context.Context, c *redislock.Client, worker int) {
	m, _ := c.NewMutex("soak:long", nil)
	for n := 0; ctx.Err() == nil; n++ {
		pauses, err := w.checker.HGet(ctx, "soak:procs", fmt.Sprintf("pauses:%d", w.cfg.Process)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			w.noteError("checker", err)
			continue
		}
		hold, err := m.TryLock(ctx, soakWait)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, redislock.ErrWaitTimeout) {
				w.noteError("long lock", err)
				time.Sleep(20 * time.Millisecond)
			}
			continue
		}
		w.acquisitions.Add(1)
		w.longHolds.Add(1)
		holder := fmt.Sprintf("%d.%d.long.%d", w.cfg.Process, w.cfg.Incarnation, n)
		valid := func() bool { return ctx.Err() == nil && hold.Err() == nil }
		w.enterFor(hold.Token(), valid, true, m.Name(), holder, pauses, 30, soakLease/10)
		if err := hold.Err(); err != nil && ctx.Err() == nil {
			w.checkLoss(holder, err)
		}
		w.unlock(hold)
	}
}

// checkLoss counts a hold lost while no fault struck in the last lease.
func (w *soakWorker) checkLoss(holder string, cause error) {
	ctx := context.Background()
	state, err := w.checker.HMGet(ctx, "soak:procs", "faulting", "fault ended").Result()
	if err != nil || len(state) != 2 {
		return
	}
	faulting, _ := state[0].(string)
	endedText, _ := state[1].(string)
	ended, _ := strconv.ParseInt(endedText, 10, 64)
	if faulting == "1" || time.Since(time.UnixMilli(ended)) < 2*soakLease {
		return
	}
	w.countViolation("holds lost to a slow Unlock", fmt.Sprintf("%s lost its hold with no fault in the last two leases: %v", holder, cause))
}

// slowUnlocks is a go-redis hook that stalls one release in every, before
// sending it, for stall: a slow Unlock, or one stuck on a dead connection
// while go-redis waits out its timeouts.
type slowUnlocks struct {
	every int
	stall time.Duration
	n     atomic.Int64
}

func (s *slowUnlocks) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *slowUnlocks) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if kind, _ := redislock.ScriptCall(cmd.Args()); kind == "release" && s.n.Add(1)%int64(s.every) == 0 {
			time.Sleep(s.stall)
		}
		return next(ctx, cmd)
	}
}

func (s *slowUnlocks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
