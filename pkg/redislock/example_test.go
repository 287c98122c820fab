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
	hold, err := mu.Lock(ctx)
	if err != nil {
		panic(err)
	}
	defer hold.Unlock(ctx)
	fmt.Println("held:", hold.Err() == nil)

	// Every Lock acts for a new owner, so a second Lock, even on the same
	// Mutex, is excluded, as with sync.Mutex.
	_, err = mu.TryLock(ctx, 0)
	fmt.Println("excluded:", errors.Is(err, redislock.ErrWaitTimeout))

	// Re-entry is explicit: a Lock whose context carries the hold's owner
	// re-enters, with the same fencing token. Its Hold needs its own Unlock.
	again, err := mu.Lock(redislock.WithHold(ctx, hold))
	if err != nil {
		panic(err)
	}
	fmt.Println("re-entered with the same token:", again.Token() == hold.Token())
	_ = again.Unlock(ctx)
	fmt.Println("still held after the inner Unlock:", hold.Err() == nil)
	// Output:
	// held: true
	// excluded: true
	// re-entered with the same token: true
	// still held after the inner Unlock: true
}

func ExampleHold_Unlock() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleRedis})
	defer rdb.Close()
	client, _ := redislock.New(rdb, redislock.Options{})
	defer client.Close()

	mu, _ := client.NewMutex("example:invoices", nil)
	hold, err := mu.Lock(ctx)
	if err != nil {
		panic(err)
	}
	_ = hold.Unlock(ctx)
	// The final Unlock ends the ownership and cancels the hold's context.
	fmt.Println("after the final Unlock:", context.Cause(hold.Context()))
	// A Hold undoes its Lock once.
	fmt.Println("unlocked again:", errors.Is(hold.Unlock(ctx), redislock.ErrNotHeld))

	// Every new ownership takes a higher fencing token.
	next, err := mu.Lock(ctx)
	if err != nil {
		panic(err)
	}
	defer next.Unlock(ctx)
	fmt.Println("next token is higher:", next.Token() > hold.Token())
	// Output:
	// after the final Unlock: redislock: lock released
	// unlocked again: true
	// next token is higher: true
}

func ExampleMutex_TryLock() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleRedis})
	defer rdb.Close()
	client, _ := redislock.New(rdb, redislock.Options{})
	defer client.Close()

	mu, _ := client.NewMutex("example:report", nil)
	hold, err := mu.Lock(ctx)
	if err != nil {
		panic(err)
	}

	// Another owner waits at most 50ms.
	_, err = mu.TryLock(ctx, 50*time.Millisecond)
	fmt.Println(errors.Is(err, redislock.ErrWaitTimeout))

	_ = hold.Unlock(ctx)
	next, err := mu.TryLock(ctx, 50*time.Millisecond)
	fmt.Println(err == nil)
	if err == nil {
		_ = next.Unlock(ctx)
	}
	// Output:
	// true
	// true
}

func ExampleWithHold() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleRedis})
	defer rdb.Close()
	client, _ := redislock.New(rdb, redislock.Options{})
	defer client.Close()

	accounts, _ := client.NewMutex("example:accounts", nil)

	// transfer locks the accounts itself. A caller that holds the lock
	// passes its hold in the context, and transfer re-enters.
	transfer := func(ctx context.Context) error {
		hold, err := accounts.Lock(ctx)
		if err != nil {
			return err
		}
		defer hold.Unlock(ctx)
		info, _ := client.Inspect(ctx, "example:accounts")
		fmt.Println("reentry count:", info.Holders[0].Count)
		return nil
	}

	hold, err := accounts.Lock(ctx)
	if err != nil {
		panic(err)
	}
	defer hold.Unlock(ctx)
	if err := transfer(redislock.WithHold(ctx, hold)); err != nil {
		panic(err)
	}
	// Output:
	// reentry count: 2
}

func ExampleHold_Context() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleRedis})
	defer rdb.Close()
	client, _ := redislock.New(rdb, redislock.Options{})
	defer client.Close()

	// A fixed lease of 100ms, no watchdog: the holder is told before the
	// lock expires on the server.
	mu, _ := client.NewMutex("example:short", &redislock.MutexOptions{Lease: 100 * time.Millisecond})
	hold, err := mu.Lock(ctx)
	if err != nil {
		panic(err)
	}
	<-hold.Context().Done()
	fmt.Println(context.Cause(hold.Context()))
	// Output:
	// redislock: lease lost: no renewal succeeded before the local deadline
}
