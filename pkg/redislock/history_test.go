package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/history"
	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// The history checker: lock clients, Redisson-script clients and a nemesis
// work on one lock of a real redis-server, every call is recorded with its
// start, end and answer, and porcupine checks the history against
// internal/history's model of a lock. `make test` runs histories for
// historyDefaultDuration, `make soak` for as long as
// LOCKWARDEN_HISTORY_DURATION says. Each history has a seed of its own,
// printed; LOCKWARDEN_HISTORY_SEED starts from a given one (a failure
// prints the seed that replays its schedule of faults and choices, though
// not its exact timing). An illegal history's porcupine visualisation is
// written to LOCKWARDEN_HISTORY_DIR, or the system's temporary directory.
const (
	envHistoryDuration = "LOCKWARDEN_HISTORY_DURATION"
	envHistorySeed     = "LOCKWARDEN_HISTORY_SEED"
	envHistoryDir      = "LOCKWARDEN_HISTORY_DIR"
	// envHistoryFaults, if set, limits the nemesis to the faults whose
	// names contain one of its comma-separated words (see historyFaults).
	envHistoryFaults       = "LOCKWARDEN_HISTORY_FAULTS"
	historyDefaultDuration = 75 * time.Second
	// envHistoryClusterDuration is TestHistoryCluster's.
	envHistoryClusterDuration     = "LOCKWARDEN_HISTORY_CLUSTER_DURATION"
	historyClusterDefaultDuration = 20 * time.Second
	// historyLength is one history's length: a few hundred operations,
	// which porcupine checks in well under a second.
	historyLength = 2 * time.Second
	historyLease  = time.Second
	// historyCheckTimeout bounds porcupine on one history.
	historyCheckTimeout = time.Minute
)

// historyClientOptions are the lock clients': short timeouts, so that a
// delayed reply is resent, as go-redis does past its read timeout, and a
// slow copy of the request may arrive after its resend.
var historyRedisOptions = redis.Options{ReadTimeout: 250 * time.Millisecond, WriteTimeout: 250 * time.Millisecond}

func historyLockOptions() redislock.Options {
	return redislock.Options{WatchdogLease: historyLease, RetryFallback: 100 * time.Millisecond}
}

// historyBounds is how long a history test runs (the duration the environment
// variable env gives, or def) and the seed of its first history (the one
// LOCKWARDEN_HISTORY_SEED gives, or a new one), which it logs.
func historyBounds(t *testing.T, env string, def time.Duration) (time.Duration, uint64) {
	total := def
	if v := os.Getenv(env); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration, such as 10m", env, v)
		}
		total = d
	}
	seed := rand.Uint64() >> 1
	if v := os.Getenv(envHistorySeed); v != "" {
		s, err := strconv.ParseUint(v, 10, 63)
		if err != nil {
			t.Fatalf("%s=%q: want a seed as printed by a run", envHistorySeed, v)
		}
		seed = s
	}
	t.Logf("first seed %d; %s=%d replays from it", seed, envHistorySeed, seed)
	return total, seed
}

// TestHistory records histories under random faults and checks each. It
// stops at the first history the model cannot explain, and prints its seed,
// the faults struck, the offending part of the history and where its
// visualisation is.
func TestHistory(t *testing.T) {
	total, seed := historyBounds(t, envHistoryDuration, historyDefaultDuration)
	faults := historyFaults
	if v := os.Getenv(envHistoryFaults); v != "" {
		faults = nil
		for _, f := range historyFaults {
			for _, want := range strings.Split(v, ",") {
				if want != "" && strings.Contains(f.name, want) {
					faults = append(faults, f)
					break
				}
			}
		}
		if len(faults) == 0 {
			t.Fatalf("%s=%q names none of the faults", envHistoryFaults, v)
		}
	}

	// No persistence: a restart loses everything.
	runHistories(t, &historyBackend{srv: redistest.Start(t)}, total, seed, faults)
}

// TestHistoryCluster is TestHistory on a Redis Cluster of three masters,
// each with a replica, whose nemesis pauses the lock's master (SIGSTOP) in
// every history until its replica takes over, and then resumes it; besides
// that it closes clients, force-releases and flushes the scripts. Its
// histories last until the failover is over: some seconds each. `make test`
// runs it for historyClusterDefaultDuration, `make history` as long as
// LOCKWARDEN_HISTORY_CLUSTER_DURATION says.
func TestHistoryCluster(t *testing.T) {
	total, seed := historyBounds(t, envHistoryClusterDuration, historyClusterDefaultDuration)
	var faults []historyFault
	for _, f := range historyFaults {
		if f.cluster {
			faults = append(faults, f)
		}
	}
	runHistories(t, &historyBackend{cluster: redistest.StartCluster(t, 3, 1), first: &failover}, total, seed, faults)
}

// historyBackend is the Redis deployment histories run on: a standalone
// server, whose lock clients each reach it through a fault proxy, or a
// Cluster, whose nemesis fails a master over first in every history.
type historyBackend struct {
	srv     *redistest.Server
	cluster *redistest.Cluster
	first   *historyFault
}

// client returns a go-redis client for a lock client: through addr, a
// proxy, on a standalone server; with opts' timeouts and retries.
func (b *historyBackend) client(addr string, opts redis.Options) redis.UniversalClient {
	if b.cluster != nil {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: b.cluster.Addrs(),
			ReadTimeout: opts.ReadTimeout, WriteTimeout: opts.WriteTimeout, MaxRetries: opts.MaxRetries})
	}
	opts.Addr = addr
	return redis.NewClient(&opts)
}

// runHistories records and checks histories until total has passed, from
// seed on, stopping at the first one the model cannot explain.
func runHistories(t *testing.T, b *historyBackend, total time.Duration, seed uint64, faults []historyFault) {
	started := time.Now()
	var histories, ops, unknown int
	var checking time.Duration
	for i := 0; i == 0 || time.Since(started) < total; i++ {
		s := seed + uint64(i)
		var h *recordedHistory
		if !t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			h = recordHistory(t, b, s, faults)
			v := history.Check(h.ops, historyCheckTimeout)
			checking += v.Took
			histories++
			ops += len(h.ops)
			unknown += h.unknown
			h.judge(t, v, s)
		}) {
			break
		}
	}
	if histories > 0 {
		t.Logf("%d histories in %v: %d operations (%d a history, %d of unknown outcome), checked in %v",
			histories, time.Since(started).Round(time.Second), ops, ops/histories, unknown, checking.Round(time.Millisecond))
	}
}

// recordedHistory is one history's operations, and what the nemesis did.
type recordedHistory struct {
	base     time.Time
	mu       sync.Mutex
	ops      []porcupine.Operation
	unknown  int
	timeline []string
}

func (h *recordedHistory) now() int64 { return int64(time.Since(h.base)) }

// add records an operation from call to now.
func (h *recordedHistory) add(lane int, in history.Input, call int64, out history.Output) {
	in.Call, in.Return = call, h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, history.Op(lane, in, out))
	if out.Result == history.Unknown {
		h.unknown++
	}
}

// note records what the nemesis did, for the printed timeline.
func (h *recordedHistory) note(format string, args ...any) {
	line := fmt.Sprintf("%9.3fms ", float64(h.now())/1e6) + fmt.Sprintf(format, args...)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.timeline = append(h.timeline, line)
}

func (h *recordedHistory) judge(t *testing.T, v history.Verdict, seed uint64) {
	t.Logf("%d operations (%d of unknown outcome) checked in %v: %s; faults:\n%s",
		len(h.ops), h.unknown, v.Took.Round(time.Millisecond), v.Result, strings.Join(h.timeline, "\n"))
	switch v.Result {
	case porcupine.Ok:
		return
	case porcupine.Unknown:
		t.Fatalf("porcupine could not decide within %v; %s=%d replays the history's faults", historyCheckTimeout, envHistorySeed, seed)
	}
	dir := os.Getenv(envHistoryDir)
	if dir == "" {
		dir = os.TempDir()
	}
	path := filepath.Join(dir, fmt.Sprintf("lockwarden-history-%d.html", seed))
	if err := history.Visualize(v, path); err != nil {
		t.Errorf("writing the visualisation: %v", err)
	} else {
		t.Logf("porcupine's visualisation: %s", path)
	}
	text := strings.TrimSuffix(path, ".html") + ".txt"
	all := "faults:\n" + strings.Join(h.timeline, "\n") + "\noperations:\n" + history.Lines(h.ops)
	if err := os.WriteFile(text, []byte(all), 0o644); err != nil {
		t.Errorf("writing the history: %v", err)
	} else {
		t.Logf("the whole history, one operation a line: %s", text)
	}
	t.Fatalf("the history is not linearizable (%s=%d replays its faults and choices):\n%s",
		envHistorySeed, seed, history.Explain(h.ops, v))
}

// historyRun is one history being recorded: the lock, its clients, and the
// workers' shared view of who holds it (for the nemesis to aim at).
type historyRun struct {
	t     *testing.T
	b     *historyBackend
	name  string
	rec   *recordedHistory
	slots []*clientSlot
	// admin is a lock client of its own, straight to Redis: the operator
	// who force-releases and inspects.
	admin    *redislock.Client
	adminRDB redis.UniversalClient
	nextID   atomic.Int64 // the next client index
	holder   atomic.Int64 // the slot whose worker holds the lock, -1 if none
	locks    lockCalls
	faults   []historyFault
	stop     chan struct{}
	stopped  atomic.Bool
	wg       sync.WaitGroup

	mu      sync.Mutex
	retired []*redislock.Client // closed by the nemesis, and their go-redis clients
	rdbs    []redis.UniversalClient
}

// lockCalls counts each model client's waiting Lock calls, so that a
// ForceRelease knows whether one was in flight while it ran
// (history.Input.Waiting).
type lockCalls struct {
	mu       sync.Mutex
	inFlight map[int]int // by client index
	started  map[int]int
}

func (l *lockCalls) begin(id int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inFlight == nil {
		l.inFlight, l.started = make(map[int]int), make(map[int]int)
	}
	l.inFlight[id]++
	l.started[id]++
}

func (l *lockCalls) end(id int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight[id]--
}

// during returns a function that tells whether a Lock call on client id
// was in flight at any moment from now until it is called.
func (l *lockCalls) during(id int) func() bool {
	l.mu.Lock()
	busy, started := l.inFlight[id] > 0, l.started[id]
	l.mu.Unlock()
	return func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return busy || l.started[id] != started
	}
}

// clientSlot is where a worker finds its lock client: the nemesis closes
// it and puts a new one, with a new index, in its place.
type clientSlot struct {
	index int
	proxy *redistest.Proxy // nil on a Cluster
	mu    sync.Mutex
	c     *redislock.Client
	id    int // the model's client index
}

func (s *clientSlot) get() (*redislock.Client, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.c, s.id
}

// newClient puts a new lock client on the slot (on its proxy) and returns
// the one it replaces, with its index.
func (r *historyRun) newClient(s *clientSlot) (*redislock.Client, int) {
	addr := ""
	if s.proxy != nil {
		addr = s.proxy.Addr
	}
	rdb := r.b.client(addr, historyRedisOptions)
	c, err := redislock.New(rdb, historyLockOptions())
	if err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	r.rdbs = append(r.rdbs, rdb)
	r.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	old, oldID := s.c, s.id
	s.c, s.id = c, int(r.nextID.Add(1))
	return old, oldID
}

// recordHistory runs one history of historyLength and returns it.
func recordHistory(t *testing.T, b *historyBackend, seed uint64, faults []historyFault) *recordedHistory {
	r := rand.New(rand.NewPCG(seed, 0x6c6f636b))
	run := &historyRun{t: t, b: b, name: fmt.Sprintf("history:%d", seed), rec: &recordedHistory{}, stop: make(chan struct{}), faults: faults}
	run.holder.Store(-1)
	if b.cluster != nil {
		run.adminRDB = b.cluster.Client(t)
	} else {
		run.adminRDB = b.srv.Client(t)
	}
	run.admin = newClient(t, run.adminRDB, historyLockOptions())
	clients, workers := 2+r.IntN(2), 3+r.IntN(3)
	for i := range clients {
		s := &clientSlot{index: i}
		if b.srv != nil {
			s.proxy = redistest.StartProxy(t, b.srv.Addr)
		}
		run.newClient(s)
		run.slots = append(run.slots, s)
	}
	redissons := r.IntN(2)
	strikes := 1 + r.IntN(3)
	// Lanes of the visualisation: two a worker (its calls, its Holds'
	// checks), then the Redisson workers, the inspector and the nemesis.
	run.rec.base = time.Now()
	for w := range workers {
		wr := rand.New(rand.NewPCG(seed, uint64(w+1)))
		run.wg.Add(1)
		go func() {
			defer run.wg.Done()
			run.work(w, run.slots[w%clients], wr)
		}()
	}
	for i := range redissons {
		rr := rand.New(rand.NewPCG(seed, uint64(100+i)))
		run.wg.Add(1)
		go func() {
			defer run.wg.Done()
			run.redisson(2*workers+i, i, rr)
		}()
	}
	run.wg.Add(1)
	go func() {
		defer run.wg.Done()
		run.inspect(2*workers + redissons)
	}()
	nemesis := rand.New(rand.NewPCG(seed, 0x6e656d))
	nemesisDone := make(chan struct{})
	go func() {
		defer close(nemesisDone)
		run.strike(2*workers+redissons+1, strikes, nemesis)
	}()
	time.Sleep(historyLength)
	<-nemesisDone
	run.stopped.Store(true)
	close(run.stop)
	run.wg.Wait()
	for _, s := range run.slots {
		c, _ := s.get()
		_ = c.Close()
	}
	run.mu.Lock()
	for _, c := range run.retired {
		_ = c.Close()
	}
	for _, rdb := range run.rdbs {
		_ = rdb.Close()
	}
	run.mu.Unlock()
	return run.rec
}

// pause sleeps for d, or less if the history ends.
func (r *historyRun) pause(d time.Duration) {
	select {
	case <-r.stop:
	case <-time.After(d):
	}
}

// work is one lock worker: Lock, TryLock with a bound, or TryLock(0); in
// the critical section, now and then a re-entry through WithHold; then
// Unlock. A Lock's context may end while it waits: a waiter killed in the
// queue.
func (r *historyRun) work(w int, slot *clientSlot, rnd *rand.Rand) {
	lane, name := 2*w, fmt.Sprintf("w%d", w)
	for !r.stopped.Load() {
		c, id := slot.get()
		m, err := c.NewMutex(r.name, nil)
		if err != nil {
			r.t.Error(err)
			return
		}
		in := history.Input{Kind: history.Lock, Client: id, Worker: name}
		call := r.rec.now()
		var hold *redislock.Hold
		r.locks.begin(id)
		switch p := rnd.Float64(); {
		case p < 0.45:
			in.Wait = -1
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+rnd.IntN(700))*time.Millisecond)
			hold, err = m.Lock(ctx)
			cancel()
		case p < 0.8:
			in.Wait = time.Duration(10+rnd.IntN(300)) * time.Millisecond
			hold, err = m.TryLock(context.Background(), in.Wait)
		default:
			hold, err = m.TryLock(context.Background(), 0)
		}
		r.locks.end(id)
		out := lockOutput(hold, err)
		r.rec.add(lane, in, call, out)
		if err != nil {
			r.pause(time.Duration(rnd.IntN(10)) * time.Millisecond)
			continue
		}
		r.holder.Store(int64(slot.index))
		r.critical(lane, name, id, m, hold, rnd)
		r.holder.CompareAndSwap(int64(slot.index), -1)
		r.pause(time.Duration(rnd.IntN(10)) * time.Millisecond)
	}
}

// critical is a Hold's critical section: its Err() is watched, it may be
// re-entered through the same Mutex (so the same client, id), and it ends
// with Unlock.
func (r *historyRun) critical(lane int, name string, id int, m *redislock.Mutex, hold *redislock.Hold, rnd *rand.Rand) {
	w := r.watch(lane+1, name, hold)
	r.pause(time.Duration(rnd.IntN(15)) * time.Millisecond)
	if rnd.IntN(4) == 0 {
		ctx := redislock.WithHold(context.Background(), hold)
		in := history.Input{Kind: history.Lock, Worker: name, Client: id, Token: hold.Token()}
		call := r.rec.now()
		var again *redislock.Hold
		var err error
		if rnd.IntN(2) == 0 {
			again, err = m.TryLock(ctx, 0)
		} else {
			in.Wait = -1
			lctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			again, err = m.Lock(lctx)
			cancel()
		}
		r.rec.add(lane, in, call, lockOutput(again, err))
		if err == nil {
			r.pause(time.Duration(rnd.IntN(5)) * time.Millisecond)
			if again.Token() == hold.Token() {
				// A re-entry shares its ownership's Err().
				r.unlock(lane, name, again, nil)
			} else {
				// It took the lock anew (its ownership had ended): its
				// own ownership, and its own Err().
				r.unlock(lane, name, again, r.watch(lane+1, name, again))
			}
		}
	}
	r.pause(time.Duration(rnd.IntN(5)) * time.Millisecond)
	r.unlock(lane, name, hold, w)
}

// unlock records a Hold's Unlock, and if w watches the Hold (its last), ends
// the watch. One whose outcome is unknown is not retried: its level is given
// up in the client, and the model allows either outcome.
func (r *historyRun) unlock(lane int, name string, hold *redislock.Hold, w *watcher) {
	in := history.Input{Kind: history.Unlock, Worker: name, Token: hold.Token()}
	call := r.rec.now()
	if w != nil {
		w.unlockCall.Store(call)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err := hold.Unlock(ctx)
	cancel()
	out := history.Output{}
	switch {
	case err == nil:
	case errors.Is(err, redislock.ErrNotOwner), errors.Is(err, redislock.ErrNotHeld):
		out.Result = history.NotCurrent
	case errors.Is(err, redislock.ErrClosed):
		out.Result = history.Nothing
	default:
		out.Result = history.Unknown
	}
	if err != nil {
		out.Err = err.Error()
	}
	r.rec.add(lane, in, call, out)
	if w != nil {
		w.unlocked <- out.Result
		<-w.done
	}
}

// watcher watches one ownership's Err(): about every millisecond until it
// is non-nil. It records the last nil (Alive) and when it turned (Death).
// Only those two matter to the model: an ownership that lost the lock never
// holds it again, so the last Alive implies every one before.
//
// While its last Unlock is in flight, a Hold says nil until the Unlock
// ends it, after the release took effect: those answers count only if the
// Unlock reports that its release did not (ErrNotOwner, ErrNotHeld), so
// the ownership must still have been the lock's. Otherwise the last Alive
// is the last one before the Unlock began.
type watcher struct {
	done       chan struct{}
	unlockCall atomic.Int64 // when the last Unlock began; 0 before
	unlocked   chan history.Result
}

func (r *historyRun) watch(lane int, name string, hold *redislock.Hold) *watcher {
	w := &watcher{done: make(chan struct{}), unlocked: make(chan history.Result, 1)}
	from := r.rec.now()
	go func() {
		defer close(w.done)
		var (
			last, before     [2]int64 // the last Alive, and the last before the Unlock
			seen, seenBefore bool
			death            = int64(-1)
			cause            string
			giveUp           <-chan time.Time
		)
		for death < 0 {
			call := r.rec.now()
			err := hold.Err()
			ret := r.rec.now()
			if err != nil {
				death, cause = ret, err.Error()
				break
			}
			last, seen = [2]int64{call, ret}, true
			if u := w.unlockCall.Load(); u == 0 || call < u {
				before, seenBefore = last, true
			}
			select {
			case <-time.After(time.Millisecond):
			case <-r.stop:
				// A Hold still alive two seconds after the history ended
				// has its last Alive recorded alone: one that outlives its
				// Unlock shows in the model.
				if giveUp == nil {
					giveUp = time.After(2 * time.Second)
				}
			case <-giveUp:
				death = 0
			}
		}
		if result := <-w.unlocked; result != history.NotCurrent && result != history.Nothing {
			last, seen = before, seenBefore
		}
		in := history.Input{Kind: history.Alive, Worker: name, Token: hold.Token()}
		if seen {
			a := in
			a.Call, a.Return = last[0], last[1]
			r.rec.mu.Lock()
			r.rec.ops = append(r.rec.ops, history.Op(lane, a, history.Output{}))
			r.rec.mu.Unlock()
		}
		if death > 0 {
			in.Kind, in.Call, in.Return = history.Death, from, death
			if seen {
				in.Call = last[1]
			}
			r.rec.mu.Lock()
			r.rec.ops = append(r.rec.ops, history.Op(lane, in, history.Output{Err: cause}))
			r.rec.mu.Unlock()
		}
	}()
	return w
}

// lockOutput is a Lock's answer as the model reads it.
func lockOutput(hold *redislock.Hold, err error) history.Output {
	switch {
	case err == nil:
		return history.Output{Token: hold.Token()}
	case errors.Is(err, redislock.ErrWaitTimeout):
		return history.Output{Result: history.Timeout, Err: err.Error()}
	case errors.Is(err, redislock.ErrLeaseMismatch), errors.Is(err, redislock.ErrNotHeld):
		// Other lease terms, or WithHold of a Hold that has ended: nothing
		// is taken.
		return history.Output{Result: history.Nothing, Err: err.Error()}
	}
	// ErrUnavailable, a context's end, ErrClosed for a Lock the Close
	// interrupted, ErrLeaseLost: the lock may have been taken.
	return history.Output{Result: history.Unknown, Err: err.Error()}
}

// inspect reads the lock every 20 to 60 ms through the operator's client.
func (r *historyRun) inspect(lane int) {
	for i := 0; !r.stopped.Load(); i++ {
		r.pause(time.Duration(20+(i*17)%40) * time.Millisecond)
		call := r.rec.now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := r.admin.Inspect(ctx, r.name)
		cancel()
		if err != nil {
			continue // a read that failed changed nothing
		}
		out := history.Output{}
		if len(info.Holders) > 0 {
			out.Holder, out.Token = history.Held, info.Token
			if owner, ok := strings.CutPrefix(string(info.Holders[0].Owner), "redisson-"); ok {
				out.Holder, out.Token = history.Foreign, 0
				out.Owner, _ = strconv.Atoi(strings.SplitN(owner, ":", 2)[0])
			}
		}
		r.rec.add(lane, history.Input{Kind: history.Inspect, Worker: "inspect"}, call, out)
	}
}

// redisson is a Redisson-script worker: RFencedLock's lock with a fixed
// lease, a short critical section well within it, and Redisson's unlock,
// each acquisition under an owner of its own. It has no Err(): the model
// keeps its ownership until its unlock, or until its lease may have run
// out. Its go-redis client does not resend (Redisson's scripts are not
// safe to run twice), and talks to Redis without a proxy.
func (r *historyRun) redisson(lane, index int, rnd *rand.Rand) {
	const lease = 500 * time.Millisecond
	addr := ""
	if r.b.srv != nil {
		addr = r.b.srv.Addr
	}
	rdb := r.b.client(addr, redis.Options{MaxRetries: -1})
	defer rdb.Close()
	sharded := redislock.ShardedPubSub(rdb)
	name := fmt.Sprintf("redisson%d", index)
	for n := 1; !r.stopped.Load(); n++ {
		owner := index*1_000_000 + n
		rl := &redistest.Redisson{RDB: rdb, Name: r.name, Lease: lease, Owner: fmt.Sprintf("redisson-%d:1", owner), Sharded: sharded}
		in := history.Input{Kind: history.RedissonLock, Worker: name, Owner: owner}
		call := r.rec.now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(100+rnd.IntN(400))*time.Millisecond)
		token, sent, err := rl.FencedLock(ctx)
		cancel()
		out := history.Output{Token: token}
		if err != nil {
			out = history.Output{Result: history.Unknown, Err: err.Error()}
		} else {
			in.Expiry = int64(sent.Sub(r.rec.base) + lease)
		}
		r.rec.add(lane, in, call, out)
		if err != nil {
			r.pause(time.Duration(rnd.IntN(10)) * time.Millisecond)
			continue
		}
		r.pause(time.Duration(rnd.IntN(15)) * time.Millisecond)
		in = history.Input{Kind: history.RedissonUnlock, Worker: name, Owner: owner}
		call = r.rec.now()
		freed, err := rl.Unlock(context.Background())
		out = history.Output{}
		switch {
		case err != nil:
			out = history.Output{Result: history.Unknown, Err: err.Error()}
		case !freed:
			out.Result = history.NotCurrent
		}
		r.rec.add(lane, in, call, out)
		r.pause(time.Duration(rnd.IntN(20)) * time.Millisecond)
	}
}

// historyFault is one kind of fault the nemesis strikes.
type historyFault struct {
	name string
	// cluster marks the faults TestHistoryCluster strikes too: those that
	// need no proxy and no single server.
	cluster bool
	strike  func(r *historyRun, lane int, rnd *rand.Rand)
}

var historyFaults = []historyFault{
	{"replies lost", false, func(r *historyRun, lane int, rnd *rand.Rand) {
		s := r.target(rnd)
		rate := 0.2 + 0.4*rnd.Float64()
		d := time.Duration(100+rnd.IntN(400)) * time.Millisecond
		r.rec.note("client slot %d loses %.0f%% of its replies for %v", s.index, 100*rate, d)
		s.proxy.LoseRepliesAtRandom(rate)
		r.pause(d)
		s.proxy.Heal()
	}},
	{"replies delayed past the read timeout", false, func(r *historyRun, lane int, rnd *rand.Rand) {
		s := r.target(rnd)
		delay := time.Duration(50+rnd.IntN(350)) * time.Millisecond
		d := time.Duration(200+rnd.IntN(500)) * time.Millisecond
		r.rec.note("client slot %d's traffic delayed %v for %v", s.index, delay, d)
		s.proxy.Delay(delay)
		r.pause(d)
		s.proxy.Heal()
	}},
	{"data lost (FLUSHALL)", false, func(r *historyRun, lane int, rnd *rand.Rand) {
		call := r.rec.now()
		if err := r.adminRDB.FlushAll(context.Background()).Err(); err != nil {
			r.t.Errorf("FLUSHALL: %v", err)
			return
		}
		in := history.Input{Kind: history.DataLoss, Worker: "nemesis"}
		in.Expiry = r.rec.now() + int64(historyLease)
		r.rec.add(lane, in, call, history.Output{})
		r.rec.note("FLUSHALL")
	}},
	{"Redis restarted without persistence", false, func(r *historyRun, lane int, rnd *rand.Rand) {
		call := r.rec.now()
		r.b.srv.Stop()
		time.Sleep(time.Duration(rnd.IntN(200)) * time.Millisecond)
		if err := r.b.srv.Restart(); err != nil {
			r.t.Errorf("restarting Redis: %v", err)
			return
		}
		in := history.Input{Kind: history.DataLoss, Worker: "nemesis"}
		in.Expiry = r.rec.now() + int64(historyLease)
		r.rec.add(lane, in, call, history.Output{})
		r.rec.note("Redis restarted without persistence (from %.3fms)", float64(call)/1e6)
	}},
	{"ForceRelease by another client", true, func(r *historyRun, lane int, rnd *rand.Rand) {
		s := r.target(rnd)
		c, id := s.get()
		in := history.Input{Kind: history.ForceRelease, Worker: "nemesis", Client: id}
		call := r.rec.now()
		waiting := r.locks.during(id)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		n, err := r.admin.ForceReleaseClient(ctx, r.name, c.ID())
		cancel()
		in.Waiting = waiting()
		in.Expiry = r.rec.now() + int64(historyLease)
		out := history.Output{Removed: n}
		if err != nil {
			out = history.Output{Result: history.Unknown, Err: err.Error()}
		}
		r.rec.add(lane, in, call, out)
		r.rec.note("ForceRelease of client %d (slot %d): %d removed, %v", id, s.index, n, err)
	}},
	{"ForceRelease by the holder's own client", true, func(r *historyRun, lane int, rnd *rand.Rand) {
		s := r.target(rnd)
		c, id := s.get()
		in := history.Input{Kind: history.ForceRelease, Worker: "nemesis", Client: id, Own: true}
		call := r.rec.now()
		waiting := r.locks.during(id)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		n, err := c.ForceReleaseClient(ctx, r.name, c.ID())
		cancel()
		in.Waiting = waiting()
		out := history.Output{Removed: n}
		switch {
		case errors.Is(err, redislock.ErrClosed):
			return // the client was closed meanwhile: nothing was sent
		case err != nil:
			out = history.Output{Result: history.Unknown, Err: err.Error()}
		}
		r.rec.add(lane, in, call, out)
		r.rec.note("ForceRelease of client %d (slot %d) by itself: %d removed, %v", id, s.index, n, err)
	}},
	{"Close in a critical section", true, func(r *historyRun, lane int, rnd *rand.Rand) {
		s := r.target(rnd)
		old, oldID := r.newClient(s)
		slow := s.proxy != nil && rnd.IntN(2) == 0
		if slow {
			// Its replies slow: Close's release is answered late.
			s.proxy.Delay(time.Duration(20+rnd.IntN(150)) * time.Millisecond)
		}
		call := r.rec.now()
		_ = old.Close()
		r.rec.add(lane, history.Input{Kind: history.Close, Worker: "nemesis", Client: oldID}, call, history.Output{})
		if slow {
			s.proxy.Heal()
		}
		r.mu.Lock()
		r.retired = append(r.retired, old)
		r.mu.Unlock()
		r.rec.note("Close of client %d (slot %d), its replies slowed: %v, from %.3fms", oldID, s.index, slow, float64(call)/1e6)
	}},
	{"SCRIPT FLUSH", true, func(r *historyRun, lane int, rnd *rand.Rand) {
		if err := r.adminRDB.ScriptFlush(context.Background()).Err(); err != nil {
			r.t.Errorf("SCRIPT FLUSH: %v", err)
		}
		r.rec.note("SCRIPT FLUSH")
	}},
}

// failover pauses the lock's master (SIGSTOP) until another node serves
// its slot, its replica having taken over, and then resumes it: it comes
// back as a replica.
var failover = historyFault{"master paused and failed over", true, func(r *historyRun, lane int, rnd *rand.Rand) {
	ctx := context.Background()
	node, err := r.adminRDB.(*redis.ClusterClient).MasterForKey(ctx, r.name)
	if err != nil {
		r.t.Errorf("the lock's master: %v", err)
		return
	}
	var master *redistest.Server
	var others []*redistest.Server
	for _, s := range append(append([]*redistest.Server(nil), r.b.cluster.Masters...), r.b.cluster.Replicas...) {
		if s.Addr == node.Options().Addr {
			master = s
		} else {
			others = append(others, s)
		}
	}
	if master == nil {
		r.t.Errorf("the lock's master %s is none of the cluster's nodes", node.Options().Addr)
		return
	}
	// A replica that rejoined after an earlier failover takes over only
	// once it is in sync.
	direct := redis.NewClient(&redis.Options{Addr: master.Addr})
	defer direct.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		info, err := direct.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online") {
			break
		}
		if time.Now().After(deadline) {
			r.t.Errorf("the lock's master %s has no replica in sync after 30s: %v\n%s", master.Addr, err, info)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	call := r.rec.now()
	if err := master.Pause(); err != nil {
		r.t.Errorf("pausing the master: %v", err)
		return
	}
	r.rec.note("master %s paused", master.Addr)
	// The new master is the node that answers a command on the lock's key
	// rather than redirect it.
	took := false
	for deadline := time.Now().Add(30 * time.Second); !took && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		for _, s := range others {
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, ReadTimeout: 200 * time.Millisecond})
			err := rdb.Exists(ctx, r.name).Err()
			_ = rdb.Close()
			if err == nil {
				took = true
				r.rec.note("%s took over", s.Addr)
				break
			}
		}
	}
	if err := master.Resume(); err != nil {
		r.t.Errorf("resuming the old master: %v", err)
	}
	if !took {
		r.t.Errorf("no replica took over from %s within 30s", master.Addr)
		return
	}
	in := history.Input{Kind: history.Failover, Worker: "nemesis"}
	in.Expiry = r.rec.now() + int64(historyLease)
	r.rec.add(lane, in, call, history.Output{})
}}

// target picks the client slot to strike: most often the holder's, where
// the cases that matter are.
func (r *historyRun) target(rnd *rand.Rand) *clientSlot {
	if h := r.holder.Load(); h >= 0 && rnd.IntN(4) != 0 {
		return r.slots[h]
	}
	return r.slots[rnd.IntN(len(r.slots))]
}

// strike strikes n faults at random times within the history, one at a
// time.
func (r *historyRun) strike(lane, n int, rnd *rand.Rand) {
	if f := r.b.first; f != nil {
		r.pause(time.Duration(200+rnd.IntN(600)) * time.Millisecond)
		f.strike(r, lane, rnd)
	}
	end := time.Now().Add(historyLength - 300*time.Millisecond)
	for range n {
		r.pause(time.Duration(rnd.Int64N(int64(historyLength / time.Duration(n+1)))))
		if time.Now().After(end) {
			return
		}
		f := r.faults[rnd.IntN(len(r.faults))]
		f.strike(r, lane, rnd)
	}
}
