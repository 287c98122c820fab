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
// connection's own. The key pattern may be narrowed to the lock names used
// plus redisson_lock_*:* and lockwarden_lock_*:*.
const MinimalACL = "+@connection +evalsha +eval +script|load +publish +subscribe +unsubscribe +spublish +ssubscribe +sunsubscribe +ping +wait " +
	"+time +exists +get +set +del +pexpire +pttl +hset +hget +hexists +hincrby +hdel +hkeys +hgetall " +
	"+zadd +zrem +zrange +zpopmin +zscore +zcard +pubsub|numsub +pubsub|shardnumsub " +
	"~* &redisson_lock__channel:* &lockwarden_lock__notice:*"

// checkPermissions makes sure the Redis user may publish on the channels
// the scripts publish on. The scripts publish with pcall, so a denial
// leaves the lock consistent, but its waiters untold until their fallback
// retry: every hand-over would take a second. New refuses such a user up
// front instead. If Redis does not answer, the check is skipped: the locks'
// own calls fail until it does.
func checkPermissions(rdb redis.UniversalClient, clientID string, sharded bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	probe := keysFor("lockwarden-acl-check")
	for _, channel := range []string{probe.noticePrefix + clientID, probe.channel} {
		// An empty message: waiters ignore it, and Redisson's only acts on "0".
		var err error
		if sharded {
			err = rdb.SPublish(ctx, channel, "").Err()
		} else {
			err = rdb.Publish(ctx, channel, "").Err()
		}
		if err != nil && strings.HasPrefix(err.Error(), "NOPERM") {
			return fmt.Errorf("redislock: the Redis user may not publish on %s (%v); grant it at least: %s", channel, err, MinimalACL)
		}
	}
	return nil
}
