package redislock

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// MinimalACL is the narrowest set of Redis ACL rules a lockwarden client
// needs, for an ACL user of its own (ACL SETUSER <user> on ><password>
// <MinimalACL>). Redis checks every command a script runs against the
// user's rules, so the list names the commands inside the scripts as well
// as the scripts themselves, the renewal, pub/sub and WAIT paths, and the
// connection's own. PUBSUB NUMSUB and SHARDNUMSUB are optional: without
// them, a release never looks for Redisson clients waiting outside the
// queue (see Waiting in the package documentation), and they get the lock
// only when they find it free. The key pattern may be narrowed to the lock
// names used plus redisson_lock_*:* and lockwarden_lock_*:*.
const MinimalACL = "+@connection +evalsha +eval +script|load +publish +subscribe +unsubscribe +spublish +ssubscribe +sunsubscribe +ping +wait " +
	"+time +exists +get +set +del +rename +pexpire +pttl +hset +hget +hmget +hexists +hincrby +hdel +hkeys +hgetall " +
	"+zadd +zrem +zrange +zrank +zpopmin +pubsub|numsub +pubsub|shardnumsub " +
	"~* &redisson_lock__channel:* &lockwarden_lock__notice:*"

// aclProbe runs every command the scripts call (with redis.call, which
// aborts a script halfway on a denial) on keys of its own, and returns the
// names of those the user may not run. A key or channel the user may not
// touch is not counted: the probe's keys are not the locks'.
var aclProbe = redis.NewScript(`
local denied = {}
local function try(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err and string.find(r.err, 'run this command', 1, true) then
    denied[#denied + 1] = (...)
  end
end
try('hset', KEYS[1], 'f', 1)
try('hmget', KEYS[1], 'f')
try('hget', KEYS[1], 'f')
try('hexists', KEYS[1], 'f')
try('hincrby', KEYS[1], 'f', 1)
try('hkeys', KEYS[1])
try('hgetall', KEYS[1])
try('pexpire', KEYS[1], 10000)
try('pttl', KEYS[1])
try('hdel', KEYS[1], 'f')
try('exists', KEYS[1], KEYS[2])
try('set', KEYS[3], '1', 'get')
try('get', KEYS[3])
try('zadd', KEYS[2], 'nx', 1, 'm')
try('zrank', KEYS[2], 'm')
try('zrange', KEYS[2], 0, 0)
try('zpopmin', KEYS[2])
try('zrem', KEYS[2], 'm')
try('time')
try('rename', KEYS[1], KEYS[1])
try('del', KEYS[1], KEYS[2], KEYS[3])
return table.concat(denied, ' ')`)

// checkPermissions makes sure the Redis user may run every command the
// scripts call, and publish on the channels they publish on. A script that
// a denial stopped halfway would leave a lock freed and handed to nobody;
// a denied PUBLISH leaves the lock consistent but its waiters untold until
// their fallback retry, so every hand-over would take a second. New refuses
// such a user up front instead. If Redis does not answer, the check is
// skipped: the locks' own calls fail until it does.
func checkPermissions(rdb redis.UniversalClient, c *Client, sharded bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	probe := keysFor("lockwarden-acl-check")
	for _, channel := range []string{probe.noticePrefix + c.opts.ID, probe.channel} {
		// An empty message: waiters ignore it, and Redisson's only acts on "0".
		var err error
		if sharded {
			err = rdb.SPublish(ctx, channel, "").Err()
		} else {
			err = rdb.Publish(ctx, channel, "").Err()
		}
		if err != nil && strings.HasPrefix(err.Error(), "NOPERM") {
			return fmt.Errorf("%w: it may not publish on %s (%v); grant it at least: %s", ErrPermission, channel, err, MinimalACL)
		}
	}
	tag := "{lockwarden-acl-check:" + c.opts.ID + "}"
	denied, err := aclProbe.Run(ctx, rdb, []string{queuePrefix + tag + ":h", queuePrefix + tag, queuePrefix + tag + ":s"}).Text()
	if err == nil && denied != "" {
		return fmt.Errorf("%w: it may not run %s, which the lock scripts call; grant it at least: %s", ErrPermission, denied, MinimalACL)
	}
	if err != nil && strings.Contains(err.Error(), "NOPERM") {
		return fmt.Errorf("%w: it may not run scripts (%v); grant it at least: %s", ErrPermission, err, MinimalACL)
	}
	return nil
}

// warnOfEviction logs a warning when Redis may evict keys under memory
// pressure (any maxmemory-policy but noeviction): an evicted lock hash is a
// lock taken from its holder unseen until its next renewal, and an evicted
// record of finished calls lets a late copy of a request take the lock for
// nobody. A user that may not run CONFIG GET is not warned.
func warnOfEviction(rdb redis.UniversalClient, c *Client) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	policy, err := rdb.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return
	}
	if p := policy["maxmemory-policy"]; p != "" && p != "noeviction" {
		c.opts.Logger.Info("warning: Redis may evict lock keys under memory pressure, taking locks from their holders; set maxmemory-policy noeviction",
			"maxmemory-policy", p)
	}
}
