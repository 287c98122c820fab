package controllers

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// slowRedisCall is how long one of the manager's Redis calls may take
// before the locks show Redis as slow. Redis answers in microseconds; a
// call this slow is a stall (a paused or swapping server, a failover, a
// saturated network) that, a few times longer, costs a hold its lease.
const slowRedisCall = 2 * time.Second

// stallShown is how long the locks keep showing the latest stall after it
// ended (Ready stays True, with the reason RedisSlow).
const stallShown = 5 * time.Minute

// stallWatch times every command the manager sends to Redis (a go-redis
// hook on the LockClients' client, so the watchdog's renewals too), and
// remembers the slowest call of the latest stall. Pub/sub receives, which
// wait by design, do not pass through it.
type stallWatch struct {
	mu   sync.Mutex
	took time.Duration // the slowest call of the latest stall
	at   time.Time     // when that stall's last slow call ended
	// onStall, if set, is called (on a goroutine of its own) when a stall
	// begins to show: the reconciler looks again at the keys it holds.
	onStall func()
	now     func() time.Time
}

func newStallWatch() *stallWatch { return &stallWatch{now: time.Now} }

// notify sets onStall.
func (w *stallWatch) notify(onStall func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.onStall = onStall
}

// observe records a call that took d and ended with err. Only a call that
// Redis answered counts (a reply, or an error reply): one that timed out or
// found no connection is Redis unavailable, which the locks show as such.
func (w *stallWatch) observe(d time.Duration, err error) {
	var reply redis.Error
	if d < slowRedisCall || (err != nil && !errors.As(err, &reply)) {
		return
	}
	w.mu.Lock()
	now := w.now()
	// A stall is the slow calls less than a slow call apart: the many
	// calls one pause held back end together.
	fresh := now.Sub(w.at) > slowRedisCall
	if fresh || d > w.took {
		w.took = d
	}
	w.at = now
	onStall := w.onStall
	w.mu.Unlock()
	if fresh && onStall != nil {
		go onStall()
	}
}

// latest is the latest stall, if it ended within stallShown: its slowest
// call, when it ended, and how long it is still shown.
func (w *stallWatch) latest() (took time.Duration, at time.Time, shownFor time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.at.IsZero() {
		return 0, time.Time{}, 0
	}
	left := stallShown - w.now().Sub(w.at)
	if left <= 0 {
		return 0, time.Time{}, 0
	}
	return w.took, w.at, left
}

func (w *stallWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (w *stallWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		w.observe(time.Since(start), err)
		return err
	}
}

func (w *stallWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		w.observe(time.Since(start), err)
		return err
	}
}
