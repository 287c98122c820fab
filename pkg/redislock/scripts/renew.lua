-- renew: extend the lease of a lock the owner still holds. The watchdog's call.
--
-- KEYS[1] lock hash  <name>
-- ARGV[1] lease in ms
-- ARGV[2] owner ID
--
-- Returns 1 when renewed, 0 when the owner no longer holds the lock.
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 1
end
return 0
