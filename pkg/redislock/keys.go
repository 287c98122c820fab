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
	channelPrefix    = "redisson_lock__channel:"
	tokenPrefix      = "redisson_lock_token:"
	queuePrefix      = "lockwarden_lock_queue:"
	queueEntryPrefix = "lockwarden_lock_queue_entry:"
	// noticePrefix + client ID is the channel on which a client's waiters
	// learn that they reached the head of a wait queue.
	noticePrefix = "lockwarden_lock__notice:"
	// releaseMessage is what Redisson publishes when a lock is freed.
	releaseMessage = "0"
)

// lockKeys are the Redis keys of one lock, and the KEYS list of its
// scripts, built once per Mutex rather than on every call.
type lockKeys struct {
	name, channel string
	// all is the KEYS list of every script but renew.lua, in the order
	// scripts/lib.lua gives.
	all []string
}

// channelFor is the channel on which the lock's release is published.
func channelFor(name string) string { return channelPrefix + "{" + name + "}" }

func keysFor(name string) lockKeys {
	tag := "{" + name + "}"
	channel := channelFor(name)
	return lockKeys{
		name:    name,
		channel: channel,
		all: []string{name, channel, tokenPrefix + tag,
			queuePrefix + tag, queueEntryPrefix + tag},
	}
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
