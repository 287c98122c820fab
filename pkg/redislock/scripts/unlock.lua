-- unlock: the last Unlock of an ownership of an owner of its own, with
-- nobody queued: release.lua's fast path, alone, with only the keys and
-- arguments it needs.
--
-- KEYS[1] lock hash            <name>
-- KEYS[2] release channel      redisson_lock__channel:{<name>}
-- KEYS[3] the last freed hash  lockwarden_lock_freed:{<name>}
-- ARGV[1] owner ID, which is also the call's ticket (see '~h' in lib.lua)
-- ARGV[2] the ownership's '~t'
--
-- Returns 0 when it freed the lock, keeping its hash in KEYS[3] (see
-- freed_by in lib.lua), and published the release message "0"; -9 when the
-- lock is not so (waiters may be queued, other levels held, the call's level
-- undone, or another ownership holds it, or none: a first run freed it):
-- nothing is changed then, and the client sends release.lua.
-- (An undone level of the call would have set '~q': see lib.lua.)
local f = redis.call('hmget', KEYS[1], ARGV[1], '~t', '~q')
if f[1] == '1' and f[2] == ARGV[2] and not f[3] then
  redis.call('rename', KEYS[1], KEYS[3])
  redis.pcall('__PUBLISH__', KEYS[2], '0')
  return 0
end
return -9
