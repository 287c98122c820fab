package redislock

import (
	"fmt"
	"strings"
)

// MaxNameLength is the longest lock name accepted, in bytes.
const MaxNameLength = 1024

// Key prefixes of Redisson's layout, plus lockwarden's wait queue. Every key
// but the lock hash itself carries the name as a hash tag, "{<name>}", so all
// keys of one lock live in the same Redis Cluster slot as the hash <name>.
const (
	channelPrefix     = "redisson_lock__channel:"
	tokenPrefix       = "redisson_lock_token:"
	queuePrefix       = "lockwarden_lock_queue:"
	queueExpiryPrefix = "lockwarden_lock_queue_expiry:"
	// noticePrefix + client ID is the channel on which a client's waiters
	// learn that they reached the head of a wait queue.
	noticePrefix = "lockwarden_lock__notice:"
	// releaseMessage is what Redisson publishes when a lock is freed.
	releaseMessage = "0"
)

// lockKeys are the Redis keys of one lock, and the KEYS lists of its
// scripts, built once per Mutex rather than on every call.
type lockKeys struct {
	name, channel, token, queue, queueExpiry string

	acquire []string // acquire.lua and inspect.lua
	release []string // release.lua
	leave   []string // leave.lua
	force   []string // force_release.lua
}

// channelFor is the channel on which the lock's release is published.
func channelFor(name string) string { return channelPrefix + "{" + name + "}" }

func keysFor(name string) lockKeys {
	tag := "{" + name + "}"
	k := lockKeys{
		name:        name,
		channel:     channelFor(name),
		token:       tokenPrefix + tag,
		queue:       queuePrefix + tag,
		queueExpiry: queueExpiryPrefix + tag,
	}
	k.acquire = []string{k.name, k.token, k.queue, k.queueExpiry}
	k.release = []string{k.name, k.channel}
	k.leave = []string{k.name, k.queue, k.queueExpiry}
	k.force = []string{k.name, k.channel, k.queue, k.queueExpiry}
	return k
}

// validateName rejects names that cannot be locked safely. Braces are refused
// because a name with its own hash tag would put the lock hash and its channel,
// token and queue in different Cluster slots.
func validateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: the name is empty", ErrInvalidName)
	case len(name) > MaxNameLength:
		return fmt.Errorf("%w: the name is %d bytes, more than the %d allowed", ErrInvalidName, len(name), MaxNameLength)
	case strings.ContainsAny(name, "{}"):
		return fmt.Errorf("%w: %q contains '{' or '}', which would split its keys across Cluster slots", ErrInvalidName, name)
	case strings.ContainsAny(name, " \t\r\n"):
		return fmt.Errorf("%w: %q contains whitespace", ErrInvalidName, name)
	}
	return nil
}
