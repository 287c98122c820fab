package redislock

import (
	"context"
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
// the script, when the server answers NOSCRIPT (after a restart or failover).
// All but renew.lua take the KEYS of lockKeys.all and get the shared helpers
// of lib.lua prepended.
var (
	acquireScript      = redis.NewScript(libLua + acquireLua)
	releaseScript      = redis.NewScript(libLua + releaseLua)
	renewScript        = redis.NewScript(renewLua)
	leaveScript        = redis.NewScript(libLua + leaveLua)
	forceReleaseScript = redis.NewScript(libLua + forceReleaseLua)
	inspectScript      = redis.NewScript(libLua + inspectLua)
)

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// loadScript loads s on every node that may run it (all masters of a Cluster).
func loadScript(ctx context.Context, rdb redis.UniversalClient, s *redis.Script) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return s.Load(ctx, node).Err()
		})
	}
	return s.Load(ctx, rdb).Err()
}

// errScriptReply reports a reply of an unexpected shape: a bug or a foreign
// script under the same SHA, never a normal outcome.
var errScriptReply = errors.New("redislock: unexpected script reply")
