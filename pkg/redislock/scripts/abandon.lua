-- abandon: mark one Lock call's level as left behind by a client that closed
-- keeping its locks (Options.KeepOnClose), so that the last release of the
-- owner's adopter frees the lock rather than leaving it to run out (see
-- '~a' in lib.lua).
--
-- KEYS[1] lock hash  <name>
-- ARGV[1] owner ID
-- ARGV[2] the call's ticket
-- ARGV[3] the ownership's '~t' (see lib.lua)
--
-- Returns 1 when it marked the level, 0 when the call holds no live level
-- in that ownership: run twice, the second run marks nothing.
local owner, ticket = ARGV[1], ARGV[2]
local f = redis.call('hmget', KEYS[1], owner, '~t', '~h' .. ticket)
if f[1] and f[2] == ARGV[3] and (f[3] == '1' or not f[3] and ticket == owner) then
  redis.call('hset', KEYS[1], '~h' .. ticket, 'a')
  redis.call('hincrby', KEYS[1], '~a', 1)
  return 1
end
return 0
