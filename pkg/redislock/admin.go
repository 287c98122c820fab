package redislock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Holder is one owner's hold on a lock, as seen in Redis.
type Holder struct {
	Owner Owner
	// Count is the owner's reentry count.
	Count int64
}

// LockInfo is a snapshot of one lock in Redis.
type LockInfo struct {
	Name string
	// Holders is empty when the lock is free. Redisson's layout allows more
	// than one field, but the scripts never create a second.
	Holders []Holder
	// TTL is the remaining lease: 0 when the lock is free, -1 when it has no
	// expiry.
	TTL time.Duration
	// Token is the fencing token of the latest ownership, 0 if none yet:
	// the holder's own while a lockwarden client holds the lock, which
	// Redis keeps with the hold even if it lost the counter.
	Token int64
	// Waiters are the live entries of the wait queue, head first.
	Waiters []Owner
}

// Held reports whether anybody holds the lock.
func (i LockInfo) Held() bool { return len(i.Holders) > 0 }

// Inspect returns a consistent snapshot of the lock, in one round trip. It
// returns ctx's error if ctx ends first, and ErrUnavailable if Redis cannot
// be reached.
func (c *Client) Inspect(ctx context.Context, name string) (LockInfo, error) {
	if err := validateName(name); err != nil {
		return LockInfo{}, err
	}
	if err := c.checkOpen(); err != nil {
		return LockInfo{}, err
	}
	k := keysFor(name)
	reply, err := run(ctx, c.rdb, c.scripts.inspect, scriptArgs(c.scripts.inspect, k.keyArgs, 0)).Slice()
	if err != nil {
		return LockInfo{}, failure(ctx, err)
	}
	if len(reply) != 4 {
		return LockInfo{}, unexpectedReply("inspect", reply)
	}
	info := LockInfo{Name: name}
	pttl, _ := reply[0].(int64)
	switch {
	case pttl == -2:
		info.TTL = 0
	case pttl < 0:
		info.TTL = -1
	default:
		info.TTL = time.Duration(pttl) * time.Millisecond
	}
	info.Token, _ = reply[1].(int64)
	fields, _ := reply[2].([]any)
	for i := 0; i+1 < len(fields); i += 2 {
		owner, _ := fields[i].(string)
		if owner == "~t" {
			// "<token> <terms>": the ownership's token (see scripts/lib.lua)
			text, _ := fields[i+1].(string)
			digits, _, _ := strings.Cut(text, " ")
			if token, err := strconv.ParseInt(digits, 10, 64); err == nil {
				info.Token = token
			}
		}
		if strings.HasPrefix(owner, "~") {
			continue // lockwarden's own (see scripts/lib.lua)
		}
		countText, _ := fields[i+1].(string)
		var count int64
		_, _ = fmt.Sscan(countText, &count)
		info.Holders = append(info.Holders, Holder{Owner: Owner(owner), Count: count})
	}
	waiters, _ := reply[3].([]any)
	for _, w := range waiters {
		id, _ := w.(string)
		info.Waiters = append(info.Waiters, Owner(id))
	}
	return info, nil
}

// ForceReleaseClient removes every hold and wait-queue entry of the lock
// whose owner ID is "<clientID>:<anything>": every owner of that client (a
// pod UID, for the in-pod client and the controller's grants), whatever its
// reentry count. If that frees the lock, it is handed to the next live
// waiter, as by an Unlock. Leases this Client held for those owners end
// with ErrReleased before Redis is told, so none of its Holds vouches for a
// lock another client may take meanwhile. It returns how many holders it
// removed, ctx's error if ctx ends first, and ErrUnavailable if Redis cannot
// be reached. The controller calls it with a pod UID when the pod
// terminates.
func (c *Client) ForceReleaseClient(ctx context.Context, name, clientID string) (int, error) {
	return c.forceRelease(ctx, name, clientID, "")
}

// ForceReleaseOwnership is ForceReleaseClient of one ownership: it removes
// the holds of the owner ID "<clientID>:<anything>" only while the lock's
// ownership is the one with the fencing token given (see Hold.Token). An
// ownership taken since, by the same owner or another, is left alone, and 0
// returned. The controller calls it to end a grant it judged by its token,
// where another manager may have taken the pod's key again meanwhile.
func (c *Client) ForceReleaseOwnership(ctx context.Context, name, clientID string, token int64) (int, error) {
	return c.forceRelease(ctx, name, clientID, strconv.FormatInt(token, 10))
}

// forceRelease is ForceReleaseClient of the ownership whose fencing token is
// token, in decimal, or of any if token is "". The client's own Holds of
// those ownerships end first.
func (c *Client) forceRelease(ctx context.Context, name, clientID, token string) (int, error) {
	if err := validateName(name); err != nil {
		return 0, err
	}
	if clientID == "" || strings.ContainsAny(clientID, " \t\r\n") {
		return 0, fmt.Errorf("%w: client ID %q is empty or contains whitespace", ErrInvalidOwner, clientID)
	}
	if err := c.checkOpen(); err != nil {
		return 0, err
	}
	prefix := clientID + ":"
	c.mu.Lock()
	var released []*ownership
	for key, l := range c.held {
		if key.name == name && strings.HasPrefix(string(key.owner), prefix) && (token == "" || strconv.FormatInt(l.token, 10) == token) {
			released = append(released, l)
		}
	}
	c.mu.Unlock()
	for _, l := range released {
		c.end(l, ErrReleased)
	}
	k := keysFor(name)
	args := scriptArgs(c.scripts.forceRelease, k.keyArgs, 2)
	args = append(args, prefix, token)
	n, err := run(ctx, c.rdb, c.scripts.forceRelease, args).Int()
	if err != nil {
		return 0, failure(ctx, err)
	}
	return n, nil
}
