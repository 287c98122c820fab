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
//	lease, err := mu.Lock(ctx) // blocks until held, or ctx ends
//	defer mu.Unlock(ctx)
//
//	// Work only while the lease is held; pass the fencing token along.
//	err = store.Write(lease.Context(), lease.Token(), data)
//
// # Owners and reentrancy
//
// A lock is held by an owner, an ID of the form "<client ID>:<n>", never by a
// goroutine. Each Mutex is its own owner unless MutexOptions.Owner names one,
// and a context can carry an owner (WithOwner) that takes precedence, so code
// that passes the context along re-enters locks its caller holds. Each Lock
// by the holding owner increments a reentry count; each Unlock decrements it,
// and the last one frees the lock.
//
// # Leases and the watchdog
//
// With MutexOptions.Lease set, a lock simply expires after that long. Without
// it, the lock gets Options.WatchdogLease (30s) and the client's one renewal
// loop renews it every RenewInterval (lease/3), in pipelined batches for all
// locks the client holds, until Unlock. Renewal is registered before Lock
// returns and ends before Unlock returns.
//
// # The lost-lease signal
//
// Every Lease has a Context (and Done channel) that is cancelled when the
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
// replica.
//
// # Waiting
//
// Waiters form a first-come, first-served queue in Redis. The Unlock that
// frees the lock hands it straight to the waiter at the head of the queue,
// with a new token, and tells that waiter on its client's notice channel: the
// waiter holds the lock when the notice arrives, without another round trip,
// and no other waiter wakes. The hand-over grants at most Options.QueueTTL of
// lease, which the new holder extends to its own lease a third of the way
// in, so a waiter that died while queued holds up the lock for at most about
// twice QueueTTL. Each client has one pub/sub connection for all its waiters.
//
// A lock freed without a hand-over (a Redisson client's release, an expired
// lease) publishes "0" on redisson_lock__channel:{<name>}, and the head of
// the queue retries. If a message is missed, a waiter retries after at most
// min(the lock's remaining lease, Options.RetryFallback ±20%). Redisson
// clients do not queue: they take the lock when it is free, so they get it
// once no lockwarden waiter is queued.
//
// # Redis layout
//
//	<name>                               hash: owner ID -> reentry count; PEXPIRE is the lease
//	redisson_lock__channel:{<name>}      channel: "0" when the lock is freed
//	redisson_lock_token:{<name>}         counter: fencing tokens, no expiry
//	lockwarden_lock_queue:{<name>}       sorted set: waiting owners, by arrival
//	lockwarden_lock_queue_entry:{<name>} hash: owner ID -> "<lapses at, ms> <lease, ms>"
//	lockwarden_lock__notice:<client ID>  channel: hand-overs and "you are next" notices for a client's waiters
//
// All keys of a lock share the hash slot of <name>, so every script call stays
// within one Redis Cluster slot; names may not contain braces. Standalone,
// Sentinel (redis.NewFailoverClient) and Cluster clients all work. Set
// Options.WaitReplicas to have Lock wait for replicas to acknowledge.
//
// # Errors
//
// Calls return ErrNotHeld, ErrNotOwner, ErrWaitTimeout, ErrUnavailable
// (wrapping the Redis error), ErrInvalidName, ErrInvalidOwner or ErrClosed;
// test them with errors.Is. None panics, and a failed call leaves the lock as
// it was.
package redislock
