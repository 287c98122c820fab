package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// TestMain starts the redis-server the Examples use, and fails the package
// if any goroutine outlives the tests.
func TestMain(m *testing.M) {
	if os.Getenv(envHolderChild) != "" { // a holder process of TestPausedHolder
		os.Exit(runHolderChild())
	}
	if cfg := os.Getenv(envSoakChild); cfg != "" { // a worker process of TestSoak
		os.Exit(runSoakChild(cfg))
	}
	dir, err := os.MkdirTemp("", "redislock-example")
	if err != nil {
		panic(err)
	}
	srv, err := redistest.StartServer(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	exampleRedis = srv.Addr
	code := m.Run()
	srv.Stop()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines outlived the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// backend gives a test fresh go-redis clients on one Redis deployment.
type backend struct {
	name     string
	newRedis func(t testing.TB) redis.UniversalClient
}

func standalone(t testing.TB) (backend, *redistest.Server) {
	srv := redistest.Start(t)
	return backend{"standalone", func(t testing.TB) redis.UniversalClient { return srv.Client(t) }}, srv
}

// cluster is a Redis Cluster of 3 masters, each with a replica, as run in
// production.
func cluster(t testing.TB) backend {
	c := redistest.StartCluster(t, 3, 1)
	return backend{"cluster", func(t testing.TB) redis.UniversalClient { return c.Client(t) }}
}

// newClient returns a Client closed at cleanup.
func newClient(t testing.TB, rdb redis.UniversalClient, opts redislock.Options) *redislock.Client {
	t.Helper()
	c, err := redislock.New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newMutex(t testing.TB, c *redislock.Client, name string, opts *redislock.MutexOptions) *redislock.Mutex {
	t.Helper()
	m, err := c.NewMutex(name, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// lockName is a lock name unique to the test.
func lockName(t testing.TB) string {
	return "test:" + strings.NewReplacer(" ", "_", "{", "(", "}", ")").Replace(t.Name())
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustLock(t testing.TB, ctx context.Context, m *redislock.Mutex) *redislock.Hold {
	t.Helper()
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("Lock %s: %v", m.Name(), err)
	}
	return l
}

func mustUnlock(t testing.TB, ctx context.Context, h *redislock.Hold) {
	t.Helper()
	if err := h.Unlock(ctx); err != nil {
		t.Fatalf("Unlock %s: %v", h.Name(), err)
	}
}

func inspect(t testing.TB, c *redislock.Client, name string) redislock.LockInfo {
	t.Helper()
	info, err := c.Inspect(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func wantErr(t testing.TB, got, want error) {
	t.Helper()
	if !errors.Is(got, want) {
		t.Fatalf("got error %v, want %v", got, want)
	}
}

// waitDone fails the test unless ch closes within d. d only bounds a test
// that would otherwise hang; it is not a performance assertion.
func waitDone(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s did not happen within %v", what, d)
	}
}

// receiveHold waits up to d for the Hold of a Lock run by lockInBackground,
// and fails the test if none comes. It returns nil if that Lock failed (the
// error is already reported).
func receiveHold(t testing.TB, got <-chan *redislock.Hold, d time.Duration, what string) *redislock.Hold {
	t.Helper()
	select {
	case l := <-got:
		return l
	case <-time.After(d):
		t.Fatalf("%s did not happen within %v", what, d)
		return nil
	}
}

// replyLoser is a go-redis hook that loses the reply of chosen script calls
// after Redis ran them, as a connection reset between the command and its
// reply would: the caller gets a network error and cannot tell whether the
// call ran.
type replyLoser struct {
	mu      sync.Mutex
	pending []func(args []any) bool // each loses the reply of one matching call
	lost    int
}

// loseNext makes the reply of the next script call that match accepts go
// missing.
func (r *replyLoser) loseNext(match func(args []any) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = append(r.pending, match)
}

// count is how many replies were lost.
func (r *replyLoser) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}

func (r *replyLoser) take(args []any) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, match := range r.pending {
		if match(args) {
			r.pending = append(r.pending[:i], r.pending[i+1:]...)
			r.lost++
			return true
		}
	}
	return false
}

func (r *replyLoser) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *replyLoser) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if name := cmd.Name(); err == nil && (name == "evalsha" || name == "eval") && r.take(cmd.Args()) {
			err = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
			cmd.SetErr(err)
		}
		return err
	}
}

func (r *replyLoser) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// acquireOf matches the acquire script calls of owner, and releaseOf its
// release calls.
func acquireOf(owner redislock.Owner) func(args []any) bool {
	return func(args []any) bool {
		kind, o := redislock.ScriptCall(args)
		return kind == "acquire" && o == string(owner)
	}
}

func releaseOf(owner redislock.Owner) func(args []any) bool {
	return func(args []any) bool {
		kind, o := redislock.ScriptCall(args)
		return kind == "release" && o == string(owner)
	}
}
