// Package redislock provides reentrant distributed locks on Redis that keep
// Redisson's data layout, so Go services using this package and Java services
// using Redisson's RLock exclude each other on the same lock name.
//
// # Quick start
//
//	client, err := redislock.New(rdb, redislock.Options{}) // rdb: any redis.UniversalClient
//	defer client.Close()
//
//	mu, err := client.NewMutex("orders", nil)
//	hold, err := mu.Lock(ctx) // blocks until held, or ctx ends
//	defer hold.Unlock(ctx)
//
//	// Work only while the hold lasts; pass the fencing token along.
//	err = store.Write(hold.Context(), hold.Token(), data)
//
// # Owners, exclusion and reentrancy
//
// A lock is held by an owner, an ID of the form "<client ID>:<n>", never by a
// goroutine. Every Lock acts for a new owner, so goroutines that share a Mutex
// exclude each other, as with sync.Mutex. Lock returns a Hold, the handle
// whose Unlock undoes that Lock and nothing else; unlocking it twice returns
// ErrNotHeld. Re-entry is explicit: a Lock whose context carries the owner of
// a hold (WithOwner(ctx, hold.Owner())) re-enters it at once, with the same
// fencing token, and returns a Hold of its own. Redis counts the levels; the
// last Unlock frees the lock. MutexOptions.Owner fixes the owner of every
// Lock of a Mutex, for a controller that holds locks on behalf of others.
//
// # Safe to send twice
//
// A reply can be lost after Redis ran the command: a timeout, a reset
// connection, a context cancelled in flight. go-redis then sends the command
// again, and so does this package, since only Redis knows what happened.
// Every script that changes a lock is safe to run twice: Lock and Unlock
// carry a request ID, and the first run's result is kept under
// lockwarden_lock_request:{<name>}:<request ID> for the retries to find (the
// idea of Redisson's unlock latch). A Lock whose outcome stays unknown leaves
// nothing that anyone renews, so whatever it took runs out with its lease. An
// Unlock that failed can be called again on the same Hold: it resends the same
// request. A failed last Unlock still ends the hold: renewal stops, and the
// lock runs out with its lease.
//
// # Leases and the watchdog
//
// With MutexOptions.Lease set, a lock simply expires after that long. Without
// it, the lock gets Options.WatchdogLease (30s) and the client's one renewal
// loop renews it every RenewInterval (lease/3), in pipelined batches for all
// locks the client holds, until Unlock. Renewal is registered before Lock
// returns and ends before Unlock returns. Leases are whole milliseconds, at
// least MinLease.
//
// # The lost-lease signal
//
// Every Hold has a Context (and Done channel) that is cancelled when the
// ownership ends or can no longer be vouched for: a renewal found the lock
// taken from the owner (ErrNotOwner), or the local deadline passed
// (ErrLeaseLost). The deadline is the send time of the last successful
// acquire or renewal, plus the lease, minus Options.SafetyMargin; it is
// measured on the monotonic clock, so the context is cancelled before the
// lock can expire on the server. Use the Context to stop work in time.
//
// # Fencing tokens
//
// A lease can outlive its holder's belief in it: a process paused past its
// lease still thinks it holds the lock. Every new ownership therefore takes a
// fencing token from the counter redisson_lock_token:{<name>}, strictly
// greater than all earlier ones and unchanged by re-entry. A protected
// resource that refuses tokens lower than the highest it has seen turns a
// stale holder's writes into errors. A token is one more than the last, or
// the server clock in microseconds if that is higher, so tokens keep rising
// even when Redis loses the counter or its last increments: a restart without
// persistence, a crash with appendfsync everysec, a failover to a lagging
// replica, or the counter's own expiry a day after its last token.
//
// # Waiting
//
// Waiters form a first-come, first-served queue in Redis. The Unlock that
// frees the lock hands it straight to the waiter at the head of the queue,
// with a new token, and tells that waiter on the lock's notice channel for
// its client: the
// waiter holds the lock when the notice arrives, without another round trip,
// and no other waiter wakes. The hand-over grants at most Options.QueueTTL of
// lease, which the new holder extends to its own lease a third of the way
// in, so a waiter that died while queued holds up the lock for at most about
// twice QueueTTL. A client listens on two channels per lock it waits for,
// the lock's release channel and its notice channel; on a Redis 7 Cluster
// they are sharded channels (SSUBSCRIBE and SPUBLISH, as Redisson uses
// there), so messages reach the lock's shard only and Redisson's waiters and
// ours wake each other. A client uses one pub/sub connection for all its
// waiters, or on a sharded Cluster one per lock waited on.
//
// An Unlock that frees the lock with nobody queued publishes "0" on
// redisson_lock__channel:{<name>}, as Redisson's does. A lock can also come
// free with nobody told: its lease ran out (Redis publishes nothing then), or
// a Redisson client released it while lockwarden waiters queued. So the
// head of the queue never sleeps longer than min(the lock's remaining lease,
// Options.RetryFallback ±20%) before it tries again, and every waiting path
// has such a bound, the wait for its subscription included. Redisson clients
// do not queue: they take the lock whenever they find it free. So that they
// get their share, a release that finds Redisson clients listening leaves
// the lock free, rather than handing it over, unless the queue is owed a
// turn for a race its head lost to one of them.
//
// # Redis layout
//
//	<name>                                   hash: owner ID -> reentry count; PEXPIRE is the lease
//	redisson_lock__channel:{<name>}          channel: "0" when the lock is freed
//	redisson_lock_token:{<name>}             counter: fencing tokens; expires a day after the last
//	lockwarden_lock_queue:{<name>}           sorted set: waiting owners, by arrival
//	lockwarden_lock_queue_entry:{<name>}     hash: owner ID -> "<lapses at, ms> <lease, ms> <client ID>", or a grant "g <token>"
//	lockwarden_lock_request:{<name>}:<id>    string: a request's result, for its retries; expires
//	lockwarden_lock__notice:{<name>}:<client ID> channel: hand-overs and "you are next" notices for a client's waiters
//
// All keys of a lock share a hash tag, so every script call stays within one
// Redis Cluster slot. As with Redisson's prefixName, the tag is {<name>}, or,
// for a name that has a tag of its own ("{tenant}:orders"), the name as it
// is. The queue keys expire two QueueTTLs after the last waiter refreshed
// them. Standalone, Sentinel (redis.NewFailoverClient) and Cluster clients
// all work. Set Options.WaitReplicas to have Lock wait for replicas to
// acknowledge, hand-overs included.
//
// # Permissions
//
// A Redis ACL user needs MinimalACL. New checks that the user may publish on
// the channels the scripts use, and refuses one that may not.
//
// # Errors
//
// Calls return ErrNotHeld, ErrNotOwner, ErrWaitTimeout, ErrUnavailable
// (wrapping the Redis error), ErrInvalidName, ErrInvalidOwner or ErrClosed,
// or the caller's own context error; test them with errors.Is. None panics,
// and a failed call leaves the lock as it was, or as the request's one run in
// Redis left it.
package redislock
