package redislock

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/lib.lua
	libLua string
	//go:embed scripts/take.lua
	takeLua string
	//go:embed scripts/unlock.lua
	unlockLua string
	//go:embed scripts/acquire.lua
	acquireLua string
	//go:embed scripts/release.lua
	releaseLua string
	//go:embed scripts/renew.lua
	renewLua string
	//go:embed scripts/ttl.lua
	ttlLua string
	//go:embed scripts/abandon.lua
	abandonLua string
	//go:embed scripts/leave.lua
	leaveLua string
	//go:embed scripts/force_release.lua
	forceReleaseLua string
	//go:embed scripts/inspect.lua
	inspectLua string
)

// The scripts run with EVALSHA, and with EVAL, which also loads the script,
// when the server answers NOSCRIPT (after a restart or failover); the
// renewal loop does the same for each pipelined renewal refused (see
// renewBatch). Scripts are loaded per node this way rather than kept as
// Redis Functions: EVALSHA works on every Redis a Redisson client works on,
// and a node that lost its cache costs one EVAL, not a deployment step.
//
// All but take.lua, unlock.lua, renew.lua, ttl.lua and abandon.lua take the KEYS of
// lockKeys and get lib.lua's helpers where they say "@lib", after their fast
// path: a call on the fast path defines none of them. take.lua and
// unlock.lua are the uncontended Lock and Unlock alone, with only the keys
// and arguments they need: Redis spends about as much on each key or
// argument of a script call as on a small command. They come in two sets,
// which differ in the command that publishes: PUBLISH, or SPUBLISH on a
// Cluster with sharded pub/sub (see subscriptions.go).
type scriptSet struct {
	take, unlock, acquire, release, leave, forceRelease, inspect *script
}

// script is one Lua script, sent by SHA, or whole when Redis lacks it.
type script struct {
	body, sha any // strings, boxed once for the argument lists
}

func newScript(body string) *script {
	sum := sha1.Sum([]byte(body))
	return &script{body: body, sha: hex.EncodeToString(sum[:])}
}

// Hash is the script's SHA1, as EVALSHA names it.
func (s *script) Hash() string { return s.sha.(string) }

var (
	classicScripts = newScriptSet("publish")
	shardedScripts = newScriptSet("spublish")
	renewScript    = newScript(renewLua)
	ttlScript      = newScript(ttlLua)
	abandonScript  = newScript(abandonLua)
)

func newScriptSet(publish string) *scriptSet {
	build := func(body string) *script {
		body = strings.Replace(body, "-- @lib\n", libLua, 1)
		return newScript(strings.ReplaceAll(body, "__PUBLISH__", publish))
	}
	return &scriptSet{
		take:         build(takeLua),
		unlock:       build(unlockLua),
		acquire:      build(acquireLua),
		release:      build(releaseLua),
		leave:        build(leaveLua),
		forceRelease: build(forceReleaseLua),
		inspect:      build(inspectLua),
	}
}

// scriptArgs returns a script call's argument list, "evalsha", its SHA, the
// key count and keys (keyArgs), then room for argc arguments, to be filled
// in by the caller.
func scriptArgs(s *script, keyArgs []any, argc int) []any {
	args := make([]any, 2+len(keyArgs), 2+len(keyArgs)+argc)
	args[0], args[1] = "evalsha", s.sha
	copy(args[2:], keyArgs)
	return args
}

// doer sends one command: a client, or a pipeline.
type doer interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// run sends a script call built by scriptArgs: by SHA, and again whole if
// Redis lacks the script.
func run(ctx context.Context, rdb doer, s *script, args []any) *redis.Cmd {
	cmd := rdb.Do(ctx, args...)
	if isNoScript(cmd.Err()) {
		args[0], args[1] = "eval", s.body
		cmd = rdb.Do(ctx, args...)
	}
	return cmd
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// unexpectedReply is the error of a script reply that no documented outcome
// has: a bug, or a foreign script under the same SHA.
func unexpectedReply(script string, reply any) error {
	return fmt.Errorf("%w: %s.lua answered %v", ErrUnexpectedReply, script, reply)
}
