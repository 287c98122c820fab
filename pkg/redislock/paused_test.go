package redislock_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// The holder child: TestMain runs runHolderChild when envHolderChild names
// the Redis address.
const (
	envHolderChild = "REDISLOCK_TEST_HOLDER_REDIS"
	pausedLease    = time.Second
	pausedLock     = "test:paused-holder"
	pausedResource = "test:paused-resource"
)

// fencedWrite is the protected resource: it accepts a write only with a
// fencing token at least as high as any it has seen, and logs what it
// accepted.
var fencedWrite = redis.NewScript(`
local highest = tonumber(redis.call('get', KEYS[1]) or 0)
if tonumber(ARGV[1]) < highest then
  return 0
end
redis.call('set', KEYS[1], ARGV[1])
redis.call('rpush', KEYS[2], ARGV[2])
return 1`)

func writeFenced(ctx context.Context, rdb redis.UniversalClient, token int64, writer string) (bool, error) {
	ok, err := fencedWrite.Run(ctx, rdb, []string{pausedResource + ":token", pausedResource + ":log"}, token, writer).Int()
	return ok == 1, err
}

// runHolderChild takes the lock, reports "HELD <token>", then writes to the
// resource every few milliseconds while its lease context is alive, and
// reports each rejected write and, finally, "LOST <cause>".
func runHolderChild() int {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envHolderChild)})
	defer rdb.Close()
	c, err := redislock.New(rdb, redislock.Options{WatchdogLease: pausedLease})
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer c.Close()
	m, _ := c.NewMutex(pausedLock, nil)
	lease, err := m.Lock(ctx)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Println("HELD", lease.Token())
	for lease.Err() == nil {
		if ok, err := writeFenced(ctx, rdb, lease.Token(), "child"); err == nil && !ok {
			fmt.Println("REJECTED")
		}
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Println("LOST", lease.Err())
	return 0
}

// TestPausedHolder stops a holder process past its lease, lets another
// holder take the lock and write, then resumes it. The stale holder's
// writes are refused by the fencing token, and its lease context is
// cancelled as soon as it runs again.
func TestPausedHolder(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	rdb := srv.Client(t)

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), envHolderChild+"="+srv.Addr)
	child.Stderr = os.Stderr
	child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = child.Process.Signal(syscall.SIGCONT)
		_ = child.Process.Kill()
		_ = child.Wait()
	})
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
	}()
	next := func() string {
		t.Helper()
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("the holder exited early")
			}
			return line
		case <-time.After(20 * time.Second):
			t.Fatal("the holder said nothing")
			return ""
		}
	}
	var childToken int64
	if _, err := fmt.Sscanf(next(), "HELD %d", &childToken); err != nil {
		t.Fatal(err)
	}

	// Pause the holder past its lease; another client takes the lock once
	// it expires, and writes with its higher token.
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, rdb, redislock.Options{RetryFallback: 100 * time.Millisecond})
	m := newMutex(t, c, pausedLock, nil)
	lease := mustLock(t, ctx, m) // only after the paused holder's lease ran out
	if lease.Token() <= childToken {
		t.Fatalf("new token %d not above the paused holder's %d", lease.Token(), childToken)
	}
	if ok, err := writeFenced(ctx, rdb, lease.Token(), "new-holder"); err != nil || !ok {
		t.Fatalf("the new holder's write: %v, %v", ok, err)
	}

	// Resume the stale holder: it learns at once that its lease is gone;
	// any write it makes before that is refused.
	resumed := time.Now()
	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	var rejected int
	for {
		line := next()
		if line == "REJECTED" {
			rejected++
			continue
		}
		if !strings.HasPrefix(line, "LOST") {
			t.Fatalf("holder said %q", line)
		}
		// On resume the overdue deadline timer and the overdue renewal race:
		// either tells the holder.
		if !strings.Contains(line, redislock.ErrLeaseLost.Error()) && !strings.Contains(line, redislock.ErrNotOwner.Error()) {
			t.Fatalf("holder's lease ended with %q, want a loss", line)
		}
		break
	}
	t.Logf("the stale holder learned of the loss %v after resuming, with %d write(s) refused meanwhile", time.Since(resumed), rejected)

	log, err := rdb.LRange(ctx, pausedResource+":log", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	seenNew := false
	for _, writer := range log {
		if writer == "new-holder" {
			seenNew = true
		} else if seenNew {
			t.Fatalf("a stale write was accepted after the new holder's: %v", log)
		}
	}
	mustUnlock(t, ctx, lease)
}
