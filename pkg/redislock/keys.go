package redislock

import (
	"fmt"
	"strings"
)

// MaxNameLength is the longest lock name accepted, in bytes.
const MaxNameLength = 1024

// Key prefixes of Redisson's layout, plus lockwarden's wait queue, its
// record of finished calls and the hash a release last freed. Every key but
// the lock hash itself carries the name's hash tag (see hashTag), so all
// keys of one lock live in the same Redis Cluster slot as the hash <name>.
const (
	channelPrefix    = "redisson_lock__channel:"
	tokenPrefix      = "redisson_lock_token:"
	queuePrefix      = "lockwarden_lock_queue:"
	queueEntryPrefix = "lockwarden_lock_queue_entry:"
	donePrefix       = "lockwarden_lock_done:"
	freedPrefix      = "lockwarden_lock_freed:"
	// noticePrefix + tag + ":" + client ID is the channel on which a
	// client's waiters for the lock learn that it was handed to them, or
	// that they head its queue.
	noticePrefix = "lockwarden_lock__notice:"
	// releaseMessage is what Redisson publishes when a lock is freed.
	releaseMessage = "0"
)

// lockKeys are the Redis keys of one lock, built once per Mutex rather than
// on every call.
type lockKeys struct {
	name, channel string
	tag           string // the hash tag the lock's other keys carry
	// noticePrefix + client ID is the lock's notice channel for a client:
	// "lockwarden_lock__notice:" + tag + ":" + client ID.
	noticePrefix string
	// members is the channel every lockwarden client waiting for the lock
	// listens on, and nobody publishes on: its count of listeners tells
	// them apart from other clients on the release channel (see outsiders
	// in scripts/lib.lua).
	members string
	// all is the KEYS list of every script but take.lua, unlock.lua,
	// renew.lua and ttl.lua, in the order scripts/lib.lua gives.
	all []string
	// keyArgs is the key count and all, boxed once for scriptArgs; nameArgs,
	// takeArgs and unlockArgs the same for the scripts that take the lock
	// hash only, take.lua's keys, and unlock.lua's.
	keyArgs, nameArgs, takeArgs, unlockArgs []any
	// nameArg is the lock name, boxed once.
	nameArg any
}

// hashTag is what the keys of the lock name carry so that they share its
// Cluster slot, the way Redisson's prefixName builds them: a name that has a
// hash tag of its own ("{tenant}:orders") is used as it is, and any other
// name is made one ("{orders}").
func hashTag(name string) string {
	if strings.Contains(name, "{") {
		return name
	}
	return "{" + name + "}"
}

// channelFor is the channel on which the lock's release is published.
func channelFor(name string) string { return channelPrefix + hashTag(name) }

func keysFor(name string) lockKeys {
	tag := hashTag(name)
	k := lockKeys{
		name:         name,
		channel:      channelFor(name),
		tag:          tag,
		noticePrefix: noticePrefix + tag + ":",
		members:      noticePrefix + tag,
	}
	k.all = []string{name, k.channel, tokenPrefix + tag, queuePrefix + tag, queueEntryPrefix + tag, donePrefix + tag, freedPrefix + tag}
	// The key count as a string: go-redis reads it to route a Cluster
	// command, and would format a number.
	k.keyArgs = make([]any, 1+len(k.all))
	k.keyArgs[0] = "7"
	for i, key := range k.all {
		k.keyArgs[1+i] = key
	}
	// The other lists share keyArgs' boxed keys.
	k.nameArg = k.keyArgs[1]
	k.nameArgs = []any{"1", k.nameArg}
	k.takeArgs = []any{"4", k.nameArg, k.keyArgs[3], k.keyArgs[4], k.keyArgs[6]}
	k.unlockArgs = []any{"3", k.nameArg, k.keyArgs[2], k.keyArgs[7]}
	return k
}

// validateName rejects names that cannot be locked safely. A name with braces
// must hold a Redis Cluster hash tag (a '{' with a later '}' and something
// between), so that its keys, built by hashTag, land in the name's own slot.
// A name that is a hash tag and nothing else ("{orders}") is refused: its
// keys would be those of the name inside it ("orders"), as Redisson builds
// them, so the two locks would share their counter, queue and channels.
func validateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: the name is empty", ErrInvalidName)
	case len(name) > MaxNameLength:
		return fmt.Errorf("%w: the name is %d bytes, more than the %d allowed", ErrInvalidName, len(name), MaxNameLength)
	case strings.ContainsAny(name, " \t\r\n"):
		return fmt.Errorf("%w: %q contains whitespace", ErrInvalidName, name)
	case strings.ContainsAny(name, "{}") && !hasHashTag(name):
		return fmt.Errorf("%w: %q has braces but no Redis Cluster hash tag: use a non-empty tag such as {tenant}:orders, or no braces", ErrInvalidName, name)
	case aliases(name):
		return fmt.Errorf("%w: %q is a hash tag alone, so its keys would be those of the lock %q: add to it, as in %s:lock, or drop the braces",
			ErrInvalidName, name, name[1:len(name)-1], name)
	}
	for _, prefix := range keyPrefixes {
		if strings.HasPrefix(name, prefix) {
			return fmt.Errorf("%w: %q starts with %q, the prefix of the keys and channels that locks keep beside their hash, so it would be, or could become, a key of another lock: choose a name without it",
				ErrInvalidName, name, prefix)
		}
	}
	return nil
}

// keyPrefixes are the prefixes of every key and channel a lock has besides
// its hash (see keysFor): a lock name must not start with one.
var keyPrefixes = []string{channelPrefix, tokenPrefix, queuePrefix, queueEntryPrefix, donePrefix, freedPrefix, noticePrefix}

// aliases reports whether name's keys are another name's: "{x}" shares
// every key but the hash with "x", whose tag it is.
func aliases(name string) bool {
	return strings.HasPrefix(name, "{") && strings.HasSuffix(name, "}") && !strings.ContainsAny(name[1:len(name)-1], "{}")
}

// hasHashTag reports whether Redis Cluster hashes key by a tag within it:
// the text between its first '{' and the next '}', if not empty.
func hasHashTag(key string) bool {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return false
	}
	end := strings.IndexByte(key[open+1:], '}')
	return end > 0
}
