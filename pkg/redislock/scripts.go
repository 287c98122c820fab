package redislock

import (
	_ "embed"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/lib.lua
	libLua string
	//go:embed scripts/acquire.lua
	acquireLua string
	//go:embed scripts/release.lua
	releaseLua string
	//go:embed scripts/renew.lua
	renewLua string
	//go:embed scripts/leave.lua
	leaveLua string
	//go:embed scripts/force_release.lua
	forceReleaseLua string
	//go:embed scripts/inspect.lua
	inspectLua string
)

// The scripts run with EVALSHA; go-redis falls back to EVAL, which also loads
// the script, when the server answers NOSCRIPT (after a restart or failover),
// and the renewal loop does the same for each pipelined renewal refused (see
// renewBatch). Scripts are loaded per node this way rather than kept as Redis
// Functions: EVALSHA works on every Redis a Redisson client works on, and a
// node that lost its cache costs one EVAL, not a deployment step.
//
// All but renew.lua take the KEYS of lockKeys.all (acquire and release with
// a request latch added) and get the shared helpers of lib.lua prepended.
// They come in two sets, which differ in the command that publishes: PUBLISH,
// or SPUBLISH on a Cluster with sharded pub/sub (see subscriptions.go).
type scriptSet struct {
	acquire, release, leave, forceRelease, inspect *redis.Script
}

var (
	classicScripts = newScriptSet("publish")
	shardedScripts = newScriptSet("spublish")
	renewScript    = redis.NewScript(renewLua)
)

func newScriptSet(publish string) *scriptSet {
	lib := strings.Replace(libLua, "local publish_command = 'publish'", "local publish_command = '"+publish+"'", 1)
	return &scriptSet{
		acquire:      redis.NewScript(lib + acquireLua),
		release:      redis.NewScript(lib + releaseLua),
		leave:        redis.NewScript(lib + leaveLua),
		forceRelease: redis.NewScript(lib + forceReleaseLua),
		inspect:      redis.NewScript(lib + inspectLua),
	}
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// errScriptReply reports a reply of an unexpected shape: a bug or a foreign
// script under the same SHA, never a normal outcome.
var errScriptReply = errors.New("redislock: unexpected script reply")
