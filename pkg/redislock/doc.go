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
// ErrNotHeld. Re-entry is explicit: a Lock whose context carries a hold of the
// lock (WithHold(ctx, hold)) re-enters it at once, with the same fencing
// token, and returns a Hold of its own; the context re-enters that lock only,
// not others. Redis counts the levels; the last Unlock frees the lock.
// MutexOptions.Owner fixes the owner of every Lock of a Mutex, for a
// controller that holds locks on behalf of others, in one Client or several.
// The holds of one owner share one lease in Redis, so they must share its
// terms: a Lock that would re-enter an ownership under another lease, or a
// fixed lease where it has a watchdog, fails with ErrLeaseMismatch and
// changes nothing.
//
// # Safe to send twice
//
// A reply can be lost after Redis ran the command: a timeout, a reset
// connection, a context cancelled in flight. go-redis then sends the command
// again, and so does this package, since only Redis knows what happened.
// Every script that changes a lock is safe to run twice: each Lock call has a
// ticket (its new owner's ID, or a random one), all its requests and its
// Hold's Unlock carry it, and the lock's own hash records each call's level
// for as long as it is held (Redisson's layout plus fields of lockwarden's,
// see scripts/lib.lua). A resent Lock finds its level there and counts none;
// a resent Unlock finds its level gone and undoes nothing more; a lock handed
// over to a waiter is its level too, which any of the waiter's requests
// takes. A copy of a Lock's request that arrives late, after its Unlock, or
// after a TryLock that returned ErrWaitTimeout, is refused too: when a
// request took long enough for that, or was resent, Redis remembers the
// finished call for as long as go-redis may still send it. A Lock whose
// outcome stays unknown leaves nothing that anyone renews, so whatever it
// took runs out with its lease. An Unlock that failed can be called again on
// the same Hold, however late; a failed last Unlock still ends the hold
// (renewal stops, and the lock runs out with its lease) and also releases
// the levels of other Holds whose Unlock failed.
//
// # Every answer is true
//
// Unlock returns nil only if the Hold's ownership was the lock's owner when
// the release ran, or the same request's first send freed it: the release
// that frees a lock keeps its hash as lockwarden_lock_freed:{<name>}:<token>
// for the rest of its lease, where a resend finds its own level; a resend
// that finds neither (Redis lost its data meanwhile, or the lease ran out
// since) returns ErrLeaseLost, since whether the release freed the lock can
// no longer be told. Anything else that
// finds the ownership gone (another client's ForceReleaseClient, a Redis
// that lost the lock, a lease that ran out) is ErrNotHeld or ErrNotOwner,
// and the Hold's Context ends with a lost lease, not ErrReleased. A Hold's
// Err() is nil only while it owns the lock, as far as the client can know:
// Close and ForceReleaseClient end the client's Holds before they release
// in Redis. (A Redis that loses a lock tells nobody: the holder learns it at
// its next renewal, which is what fencing tokens are for.) Run Redis with
// maxmemory-policy noeviction: an evicted lock is taken from its holder
// unseen, and an evicted record of finished calls lets a late copy of a
// request take a lock for nobody; New logs a warning when Redis may evict.
//
// # Leases and the watchdog
//
// With MutexOptions.Lease set, a lock simply expires after that long, unless
// Hold.Refresh extends it; Hold.TTL tells how long it has left. Without it,
// the lock gets Options.WatchdogLease (30s) and the client's one renewal loop
// renews it every RenewInterval (lease/3), in pipelined batches for all locks
// the client holds, until Unlock. Renewal is registered before Lock returns
// and ends before Unlock returns; a renewal in flight never extends a lock
// released meanwhile, and never waits for a release, so a slow Unlock holds
// up no other lock's renewal. Leases are whole milliseconds, at least
// MinLease. Close releases the locks the client holds, unless
// Options.KeepOnClose leaves them to another process of the same owners:
// that process's Lock for the owner re-enters the ownership, and its last
// Unlock frees the lock.
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
// the clock in microseconds if that is higher (the acquiring client's, or
// the releasing client's for a hand-over), so tokens keep rising even when
// Redis loses the counter or its last increments: a restart without
// persistence, a crash with appendfsync everysec, a failover to a lagging
// replica; provided the clocks of the clients that take a lock are not
// further apart than such a loss takes. The counter is Redisson's, and keeps Redisson's semantics: it
// never expires, and Redisson's fenced lock INCRs it, so a Go and a Java
// holder's tokens rise together.
//
// # Waiting
//
// Waiters form a first-come, first-served queue in Redis. A waiter that died
// while queued costs nothing but its queue TTL: each attempt drops the
// lapsed entries ahead of the caller, and tells it how soon the others
// lapse, when it would head the queue. The Unlock that
// frees the lock hands it straight to the waiter at the head of the queue,
// with a new token, and tells that waiter on the lock's notice channel for
// its client: the waiter holds the lock when the notice arrives, without
// another round trip, and no other waiter wakes. The hand-over grants at most
// the waiter's own Options.QueueTTL of lease, which the new holder extends to
// its own lease a third of the way in, so a waiter that died while queued
// holds up the lock for at most about twice its QueueTTL; no client's
// QueueTTL shortens another's place or hand-over. A client listens on three
// channels per lock it waits for, the lock's release channel, its notice
// channel and a members channel that counts lockwarden's listeners; on a
// Redis 7 Cluster they are sharded channels (SSUBSCRIBE and SPUBLISH, as
// Redisson uses there), so messages reach the lock's shard only and
// Redisson's waiters and ours wake each other. A client uses one pub/sub
// connection for all its waiters, or on a sharded Cluster one per shard;
// after a failover moves a slot, or a shard's connection breaks or stops
// answering its PING (a hung node), the client subscribes again on the
// slot's new master, and its waiters retry.
//
// An Unlock that frees the lock with nobody queued publishes "0" on
// redisson_lock__channel:{<name>}, as Redisson's does. A lock can also come
// free with nobody told: its lease ran out (Redis publishes nothing then), or
// a Redisson client released it while lockwarden waiters queued. So the head
// of the queue never sleeps longer than min(the lock's remaining lease,
// Options.RetryFallback ±20%) before it tries again, the waiter second in
// line no longer than until the entry ahead of it lapses, and every waiting
// path has such a bound, the wait for its subscription included.
//
// Redisson clients do not queue: they take the lock whenever they find it
// free, and TryLock(ctx, 0) does the same. So that Redisson clients get
// their share, a release leaves the lock free, rather than handing it over,
// for ten seconds after a Redisson holder was last seen, unless the queue is
// owed a turn for a race its head lost to one. The head of the queue takes
// the lock after such a race once its wait is over: 10 ms at first, doubled
// after each race nobody outside the queue took, up to 80 ms, while clients
// that are not lockwarden's listen on the release channel, since a loaded
// machine's Redisson clients answer a release later than an idle one's, and
// back at 10 ms once nobody does. Redisson waiters that never got the lock
// are found by a race now and then, when clients that are not lockwarden's
// listen on the release channel (PUBSUB NUMSUB): a second after the queue
// formed, then ever more rarely, up to every 30 s, while none wins one. A
// plain listener, such as the controller, so costs a waiter one extra round
// trip, and up to 80 ms, now and then, and never turns the hand-over off.
//
// # Redis layout
//
//	<name>                                   hash: owner ID -> reentry count (Redisson's); PEXPIRE is the lease;
//	                                         and lockwarden's ~t (token and lease terms), ~h<ticket> (a call's level), ~q (waiters)
//	redisson_lock__channel:{<name>}          channel: "0" when the lock is freed
//	redisson_lock_token:{<name>}             counter: fencing tokens (Redisson's; no expiry)
//	lockwarden_lock_queue:{<name>}           sorted set: waiting owners, by arrival
//	lockwarden_lock_queue_entry:{<name>}     hash: owner ID -> "<lapses at, ms> <lease ms> <queue TTL ms> <client ID> <ticket> <terms>"; fair-share state
//	lockwarden_lock_done:{<name>}            hash: tickets of finished calls whose requests may still arrive late; expires
//	lockwarden_lock_freed:{<name>}:<token>   hash: the lock hash as the release that freed that ownership left it; expires with the lease it had
//	lockwarden_lock__notice:{<name>}:<client ID> channel: hand-overs and "you are next" notices for a client's waiters
//
// All keys of a lock share a hash tag, so every script call stays within one
// Redis Cluster slot. As with Redisson's prefixName, the tag is {<name>}, or,
// for a name that has a tag of its own ("{tenant}:orders"), the name as it
// is; a name that is a tag alone ("{orders}") would share every key but the
// hash with another ("orders"), and is refused, as is a name that starts
// with the prefix of one of these keys or channels. The queue keys expire two
// QueueTTLs after the last waiter refreshed them. Standalone, Sentinel
// (redis.NewFailoverClient) and Cluster clients all work. Set
// Options.WaitReplicas to have Lock wait for replicas to acknowledge,
// hand-overs included.
//
// # Permissions
//
// A Redis ACL user needs MinimalACL. New checks that the user may run every
// command the scripts call and publish on the channels they use, and refuses
// one that may not.
//
// # Errors
//
// Calls return ErrNotHeld, ErrNotOwner, ErrWaitTimeout, ErrUnavailable
// (wrapping the Redis error), ErrLeaseMismatch, ErrLeaseLost (a Lock whose
// lease ran out before Redis's answer came back), ErrInvalidName,
// ErrInvalidOwner, ErrPermission (New, for a Redis user that may not run
// what the scripts run), ErrUnexpectedReply (a script answered what none of
// its documented outcomes is: a bug) or ErrClosed, or the caller's own
// context error; test them with errors.Is. A Hold's Context ends with ErrReleased, ErrNotOwner,
// ErrLeaseLost or ErrClosed. None panics, and a failed call leaves the lock
// as it was, or as the request's one run in Redis left it.
package redislock
