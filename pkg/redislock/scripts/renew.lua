-- renew: extend the lease of an ownership that still holds the lock. The
-- watchdog's call, and Hold.Refresh's.
--
-- KEYS[1] lock hash  <name>
-- ARGV[1] owner ID
-- ARGV[2] the ownership's '~t' (see lib.lua)
-- ARGV[3] lease, ms
--
-- Returns 1 when renewed, 0 when the ownership no longer holds the lock: a
-- renewal sent before a release and run after it changes nothing, nor does
-- one for an ownership that a newer one of the same owner replaced.
local f = redis.call('hmget', KEYS[1], ARGV[1], '~t')
if f[1] and f[2] == ARGV[2] then
  redis.call('pexpire', KEYS[1], ARGV[3])
  return 1
end
return 0
