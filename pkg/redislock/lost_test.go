package redislock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// sendRecorder is a go-redis hook that remembers when the last successful
// script call (an acquire or a renewal batch) was sent. The server applied
// that call's PEXPIRE after it was sent, so the lock cannot expire on the
// server before that send time plus the lease.
type sendRecorder struct {
	mu       sync.Mutex
	lastSent time.Time
}

func (r *sendRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *sendRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sent := time.Now()
		err := next(ctx, cmd)
		r.record(sent, []redis.Cmder{cmd})
		return err
	}
}

func (r *sendRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		sent := time.Now()
		err := next(ctx, cmds)
		r.record(sent, cmds)
		return err
	}
}

func (r *sendRecorder) record(sent time.Time, cmds []redis.Cmder) {
	for _, cmd := range cmds {
		// EVAL too: a renewal the server refused for want of the script
		// (NOSCRIPT) is sent again by EVAL.
		if name := cmd.Name(); name != "evalsha" && name != "eval" || cmd.Err() != nil {
			return
		}
	}
	r.mu.Lock()
	r.lastSent = sent
	r.mu.Unlock()
}

func (r *sendRecorder) last() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastSent
}

// testLostLease holds a watchdog lock through rdb, cuts the holder off
// from Redis with fault, and checks that the lease's context is cancelled
// before the lock could have expired on the server.
func testLostLease(t *testing.T, rdb *redis.Client, fault func()) {
	const leaseTime = time.Second
	rec := &sendRecorder{}
	rdb.AddHook(rec)
	// The default margin (a tenth of the lease) leaves the timer and this
	// goroutine 100 ms to run, which a loaded machine does not always give;
	// what is tested is that the context ends before the server's expiry.
	c := newClient(t, rdb, redislock.Options{WatchdogLease: leaseTime, SafetyMargin: 400 * time.Millisecond})
	m := newMutex(t, c, lockName(t), nil)
	lease := mustLock(t, testContext(t), m)
	time.Sleep(leaseTime / 2) // let a renewal or two succeed

	fault()
	waitDone(t, lease.Done(), 10*time.Second, "the lost-lease signal")
	cancelled := time.Now()
	wantErr(t, lease.Err(), redislock.ErrLeaseLost)
	if expiry := rec.last().Add(leaseTime); !cancelled.Before(expiry) {
		t.Fatalf("lease context cancelled at %v, after the earliest server expiry %v", cancelled.Sub(rec.last()), leaseTime)
	}
}

func TestLostLeaseWhenRedisSleeps(t *testing.T) {
	srv := redistest.Start(t)
	testLostLease(t, srv.Client(t), func() {
		sleeper := srv.Client(t)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = sleeper.Do(context.Background(), "debug", "sleep", "3").Err()
		}()
		t.Cleanup(func() { <-done })
	})
}

func TestLostLeaseWhenRedisStops(t *testing.T) {
	srv := redistest.Start(t)
	testLostLease(t, srv.Client(t), srv.Stop)
}

// TestLostLeaseWhenPartitioned cuts, then slows, the network between the
// holder and Redis with a proxy; Redis itself keeps running.
func TestLostLeaseWhenPartitioned(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(*redistest.Proxy)
	}{
		{"cut", (*redistest.Proxy).Cut},
		{"slow", func(p *redistest.Proxy) { p.Delay(3 * time.Second) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			proxy := redistest.StartProxy(t, srv.Addr)
			rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr})
			t.Cleanup(func() { _ = rdb.Close() })
			testLostLease(t, rdb, func() { tc.fault(proxy) })
		})
	}
}

// TestLockRefusesALeaseThatRanOutInFlight slows the network past a fixed
// lease: Redis grants the lock, but by the time the answer arrives the lease
// is over, so Lock reports it lost instead of handing out a lease that
// another owner may already hold.
func TestLockRefusesALeaseThatRanOutInFlight(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	c := newClient(t, rdb, redislock.Options{})
	m := newMutex(t, c, lockName(t), &redislock.MutexOptions{Lease: time.Second})
	if err := rdb.Ping(testContext(t)).Err(); err != nil { // connect before slowing down
		t.Fatal(err)
	}
	proxy.Delay(1200 * time.Millisecond)
	_, err := m.TryLock(testContext(t), 0)
	wantErr(t, err, redislock.ErrLeaseLost)
}

// fence is a protected resource in the test process: it accepts a write
// only with a fencing token at least as high as any it has accepted.
type fence struct {
	mu      sync.Mutex
	highest int64
}

func (f *fence) write(token int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if token < f.highest {
		return false
	}
	f.highest = token
	return true
}

// TestRedisRestartWithAOF crashes (SIGKILL) and restarts a Redis that logs
// every write to its append-only file with fsync every second. What Redis
// has written to the file survives a crash of its process: the lock comes
// back, nobody else can take it, and the holder keeps it. With everysec,
// Redis may hold back writing the file for up to 2 s while an earlier fsync
// is slow, still replying to clients; writes acknowledged in that window
// are lost in a crash (appendfsync always closes it, TestSoak uses it). The
// test waits until the acquire is written, which is the common case.
func TestRedisRestartWithAOF(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "everysec")
	ctx := testContext(t)
	const leaseTime = 2 * time.Second
	holder := newClient(t, srv.Client(t), redislock.Options{WatchdogLease: leaseTime})
	other := newClient(t, srv.Client(t), redislock.Options{})
	name := lockName(t)
	holding := newMutex(t, holder, name, nil)
	held := mustLock(t, ctx, holding)
	var resource fence
	resource.write(held.Token())

	waitAOFWritten(t, srv.Client(t))
	srv.Stop()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	contender := newMutex(t, other, name, nil)
	if _, err := contender.TryLock(ctx, 0); !errors.Is(err, redislock.ErrWaitTimeout) {
		t.Fatalf("TryLock on a lock restored from the AOF: %v, want ErrWaitTimeout", err)
	}
	// Outlast the lease the lock had when Redis died: only renewals after
	// the restart can have kept it.
	time.Sleep(leaseTime + leaseTime/2)
	if err := held.Err(); err != nil {
		t.Fatalf("the holder lost a lock that survived the restart: %v", err)
	}
	if info := inspect(t, other, name); len(info.Holders) != 1 || info.Holders[0].Owner != held.Owner() {
		t.Fatalf("holders after the restart = %+v, want %s", info.Holders, held.Owner())
	}

	mustUnlock(t, ctx, held)
	next := mustLock(t, ctx, contender)
	if next.Token() <= held.Token() || !resource.write(next.Token()) {
		t.Fatalf("the next holder's token %d, after %d, was not accepted", next.Token(), held.Token())
	}
	mustUnlock(t, ctx, next)
}

// TestRedisRestartWithoutPersistence crashes and restarts a Redis that keeps
// nothing on disk. The lock is forgotten, so another client can take it at
// once, and the two overlap until the old holder's next renewal tells it.
// The fencing counter is forgotten too, but starts again from the server
// clock, so the new holder's token is still higher and the resource refuses
// the old holder.
func TestRedisRestartWithoutPersistence(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	holder := newClient(t, srv.Client(t), redislock.Options{WatchdogLease: time.Second})
	other := newClient(t, srv.Client(t), redislock.Options{})
	name := lockName(t)
	held := mustLock(t, ctx, newMutex(t, holder, name, nil))
	var resource fence
	resource.write(held.Token())

	srv.Stop()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	next := mustLock(t, ctx, newMutex(t, other, name, nil))
	taken := time.Now()
	if next.Token() <= held.Token() || !resource.write(next.Token()) {
		t.Fatalf("the new holder's token %d, after %d, was not accepted", next.Token(), held.Token())
	}
	waitDone(t, held.Done(), 10*time.Second, "the lost-lease signal after a restart")
	t.Logf("the old holder learned of the loss %v after the new holder took the lock", time.Since(taken).Round(time.Millisecond))
	// Either a renewal answered "not owner" or, if none got through in
	// time, the deadline passed; both mean it is lost.
	if err := held.Err(); !errors.Is(err, redislock.ErrNotOwner) && !errors.Is(err, redislock.ErrLeaseLost) {
		t.Fatalf("lease ended with %v", err)
	}
	if resource.write(held.Token()) {
		t.Fatal("the resource accepted the old holder's token after the new holder's")
	}
}

// waitAOFWritten waits until Redis has written everything it acknowledged
// to its append-only file.
func waitAOFWritten(t *testing.T, rdb *redis.Client) {
	t.Helper()
	for range 500 {
		info, err := rdb.Info(context.Background(), "persistence").Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info, "aof_buffer_length:0\r\n") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("Redis did not write its append-only file within 5s")
}
