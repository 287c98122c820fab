package redislock

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// ScriptCall tells a test's go-redis hook which of the package's scripts an
// EVALSHA or EVAL command runs ("acquire" for acquire.lua and take.lua,
// "release" for release.lua and unlock.lua, "renew", "ttl", "leave",
// "force_release", "inspect", "abandon"; "" for any other command), and the owner ID
// it acts for.
func ScriptCall(args []any) (kind, owner string) {
	if len(args) < 3 {
		return "", ""
	}
	var id string
	switch name, _ := args[0].(string); strings.ToLower(name) {
	case "evalsha":
		id = fmt.Sprint(args[1])
	case "eval":
		sum := sha1.Sum([]byte(fmt.Sprint(args[1])))
		id = hex.EncodeToString(sum[:])
	default:
		return "", ""
	}
	numKeys, err := strconv.Atoi(fmt.Sprint(args[2]))
	if err != nil || len(args) < 3+numKeys {
		return "", ""
	}
	argv := args[3+numKeys:]
	arg := func(i int) string {
		if i < len(argv) {
			return fmt.Sprint(argv[i])
		}
		return ""
	}
	return scriptCall(id, arg)
}

// scriptCall names the script whose SHA is id and the owner its call acts
// for, from its ARGV (arg(0) is ARGV[1]).
func scriptCall(id string, arg func(int) string) (kind, owner string) {
	for _, set := range []*scriptSet{classicScripts, shardedScripts} {
		switch id {
		case set.acquire.Hash(), set.take.Hash():
			return "acquire", arg(0)
		case set.release.Hash(), set.unlock.Hash():
			return "release", arg(0)
		case set.leave.Hash():
			return "leave", arg(0)
		case set.forceRelease.Hash():
			return "force_release", ""
		case set.inspect.Hash():
			return "inspect", ""
		}
	}
	switch id {
	case renewScript.Hash():
		return "renew", arg(0)
	case ttlScript.Hash():
		return "ttl", arg(0)
	case abandonScript.Hash():
		return "abandon", arg(0)
	}
	return "", ""
}
