-- ttl: the remaining lease of an ownership, Hold.TTL's call.
--
-- KEYS[1] lock hash  <name>
-- ARGV[1] owner ID
-- ARGV[2] the ownership's '~t' (see lib.lua)
--
-- Returns the lease left in ms (-1: no expiry), or -2 when the ownership no
-- longer holds the lock.
local f = redis.call('hmget', KEYS[1], ARGV[1], '~t')
if f[1] and f[2] == ARGV[2] then
  return redis.call('pttl', KEYS[1])
end
return -2
