package redislock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/redistest"
)

// TestShardedSubscriptionsReachTheirSlot: on a Cluster with sharded pub/sub,
// each lock's SSUBSCRIBE must go to the master of the lock's slot. A
// connection opened on another node answers MOVED, the confirmation never
// comes, and a waiter sleeps through its hand-over. The receiving goroutine
// must not open the connection before the subscription names its channels:
// with no channels, go-redis picks a random node.
func TestShardedSubscriptionsReachTheirSlot(t *testing.T) {
	const locks = 60
	cl := redistest.StartCluster(t, 3, 0)
	c, err := New(cl.Client(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.waits.sharded {
		t.Fatal("the test Cluster has no sharded pub/sub")
	}
	ctx := context.Background()
	var confirmations []<-chan struct{}
	for i := range locks {
		m, err := c.NewMutex(fmt.Sprintf("sub-%d", i), nil)
		if err != nil {
			t.Fatal(err)
		}
		w := &waiter{key: holdKey{m.Name(), c.NewOwner()}, wake: make(chan struct{}, 1), done: make(chan struct{})}
		confirmed, err := c.waits.subscribe(ctx, w, &m.keys)
		if err != nil {
			t.Fatal(err)
		}
		confirmations = append(confirmations, confirmed)
	}
	deadline := time.After(10 * time.Second)
	for i, confirmed := range confirmations {
		select {
		case <-confirmed:
		case <-deadline:
			t.Fatalf("lock %d of %d: no SSUBSCRIBE confirmation", i, locks)
		}
	}
}
