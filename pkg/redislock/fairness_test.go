package redislock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// A mixed fleet shares a lock fairly: 4 lockwarden clients and 4 clients
// running Redisson's own scripts contend for one lock, and each side gets at
// least 40% of the acquisitions (the issue 21 target for the Redisson side)
// once lockwarden's releases found the Redisson clients: the first 200
// acquisitions, while they may not yet have, are not counted. Hand-overs
// alone would starve the Redisson clients, who only take a lock they find
// free. Both sides also exclude each other throughout: the critical section
// counts overlaps.
func TestMixedFleetIsFair(t *testing.T) {
	srv := redistest.Start(t)
	// 1,000 acquisitions: more than testContext's 30 s on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	name := lockName(t)
	const perSide, warmup, rounds = 4, 200, 800

	var inside, overlaps atomic.Int32
	var all, ours, theirs atomic.Int64
	critical := func(side *atomic.Int64) {
		if inside.Add(1) != 1 {
			overlaps.Add(1)
		}
		time.Sleep(200 * time.Microsecond)
		inside.Add(-1)
		if all.Add(1) > warmup {
			side.Add(1)
		}
	}
	done := func() bool { return all.Load() >= warmup+rounds }

	var wg sync.WaitGroup
	for i := range perSide {
		c := newClient(t, srv.Client(t), redislock.Options{RetryFallback: 100 * time.Millisecond, QueueTTL: time.Second})
		m := newMutex(t, c, name, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done() && ctx.Err() == nil {
				hold, err := m.Lock(ctx)
				if err != nil {
					t.Errorf("lockwarden client %d: %v", i, err)
					return
				}
				critical(&ours)
				if err := hold.Unlock(ctx); err != nil {
					t.Errorf("lockwarden client %d: %v", i, err)
					return
				}
				time.Sleep(500 * time.Microsecond)
			}
		}()
		r := &redistest.Redisson{RDB: srv.Client(t), Name: name, Owner: fmt.Sprintf("0b7e3c11-redisson-%d:1", i), Lease: 30 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done() && ctx.Err() == nil {
				if err := r.Lock(ctx); err != nil {
					if ctx.Err() == nil {
						t.Errorf("Redisson client %d: %v", i, err)
					}
					return
				}
				critical(&theirs)
				if _, err := r.Unlock(ctx); err != nil {
					t.Errorf("Redisson client %d: %v", i, err)
					return
				}
				time.Sleep(500 * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	total := ours.Load() + theirs.Load()
	t.Logf("%d acquisitions: lockwarden %d, Redisson %d", total, ours.Load(), theirs.Load())
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d acquisitions overlapped another", n)
	}
	for side, n := range map[string]int64{"lockwarden": ours.Load(), "Redisson": theirs.Load()} {
		if n*10 < total*4 {
			t.Errorf("%s clients got %d of %d acquisitions, under 40%%", side, n, total)
		}
	}
}
