package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// exampleRedis is the address of the redis-server TestMain starts for the
// examples.
var exampleRedis string

func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleRedis})
	defer rdb.Close()

	client, err := redislock.New(rdb, redislock.Options{})
	if err != nil {
		panic(err)
	}
	defer client.Close()

	mu, err := client.NewMutex("example:orders", nil)
	if err != nil {
		panic(err)
	}
	lease, err := mu.Lock(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", lease.Err() == nil)

	// Re-entry by the same owner returns the same lease and token.
	again, _ := mu.Lock(ctx)
	fmt.Println("re-entered:", again == lease)

	_ = mu.Unlock(ctx)
	_ = mu.Unlock(ctx)
	fmt.Println("after the final Unlock:", lease.Err())

	// Every new ownership takes a higher fencing token.
	next, _ := mu.Lock(ctx)
	fmt.Println("next token is higher:", next.Token() > lease.Token())
	_ = mu.Unlock(ctx)
	// Output:
	// held: true
	// re-entered: true
	// after the final Unlock: redislock: lock released
	// next token is higher: true
}

func ExampleMutex_TryLock() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleRedis})
	defer rdb.Close()
	client, _ := redislock.New(rdb, redislock.Options{})
	defer client.Close()

	holder, _ := client.NewMutex("example:report", nil)
	other, _ := client.NewMutex("example:report", nil) // a different owner
	_, _ = holder.Lock(ctx)

	_, err := other.TryLock(ctx, 50*time.Millisecond)
	fmt.Println(errors.Is(err, redislock.ErrWaitTimeout))
	fmt.Println(errors.Is(other.Unlock(ctx), redislock.ErrNotOwner))
	_ = holder.Unlock(ctx)
	// Output:
	// true
	// true
}

func ExampleWithOwner() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleRedis})
	defer rdb.Close()
	client, _ := redislock.New(rdb, redislock.Options{})
	defer client.Close()

	// The owner travels with the context, so nested code re-enters.
	ctx = redislock.WithOwner(ctx, client.NewOwner())
	accounts, _ := client.NewMutex("example:accounts", nil)

	transfer := func(ctx context.Context) error {
		if _, err := accounts.Lock(ctx); err != nil {
			return err
		}
		defer accounts.Unlock(ctx)
		info, _ := client.Inspect(ctx, "example:accounts")
		fmt.Println("reentry count:", info.Holders[0].Count)
		return nil
	}
	_, _ = accounts.Lock(ctx)
	_ = transfer(ctx)
	_ = accounts.Unlock(ctx)
	// Output:
	// reentry count: 2
}

func ExampleLease_Context() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleRedis})
	defer rdb.Close()
	client, _ := redislock.New(rdb, redislock.Options{})
	defer client.Close()

	// A fixed lease of 100ms, no watchdog: the holder is told before the
	// lock expires on the server.
	mu, _ := client.NewMutex("example:short", &redislock.MutexOptions{Lease: 100 * time.Millisecond})
	lease, _ := mu.Lock(ctx)
	<-lease.Context().Done()
	fmt.Println(context.Cause(lease.Context()))
	// Output:
	// redislock: lease lost: no renewal succeeded before the local deadline
}
