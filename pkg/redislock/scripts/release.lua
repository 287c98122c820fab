-- release: undo one entry of the owner's hold on the lock.
--
-- KEYS[1] lock hash           <name>
-- KEYS[2] release channel     redisson_lock__channel:{<name>}
-- ARGV[1] owner ID
-- ARGV[2] lease in ms, restored while re-entries remain
-- ARGV[3] 1 to undo every level of the owner's hold at once, else 0 or absent
--
-- Returns the owner's remaining reentry count (0: the lock was freed, and the
-- release message "0" was published), -1 when the lock is not held by anyone,
-- or -2 when it is held by another owner. In both negative cases nothing is
-- changed.
local owner = ARGV[1]
if redis.call('hexists', KEYS[1], owner) == 0 then
  if redis.call('exists', KEYS[1]) == 1 then
    return -2
  end
  return -1
end
local count = 0
if ARGV[3] ~= '1' then
  count = redis.call('hincrby', KEYS[1], owner, -1)
end
if count > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return count
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], '0')
return 0
