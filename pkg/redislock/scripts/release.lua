-- release: undo one entry of the owner's hold on the lock. KEYS: see lib.lua.
--
-- ARGV[1] owner ID
-- ARGV[2] lease in ms, restored while re-entries remain
-- ARGV[3] 1 to undo every level of the owner's hold at once, else 0
-- ARGV[4] notice channel prefix
-- ARGV[5] longest lease in ms a hand-over grants before the new holder
--         extends it (the releasing client's queue TTL)
--
-- Returns the owner's remaining reentry count (0: the lock was handed to the
-- next waiter, or freed and the release message "0" published), -1 when the
-- lock is not held by anyone, or -2 when it is held by another owner. In both
-- negative cases nothing is changed.
local owner = ARGV[1]
local function not_held()
  if redis.call('exists', KEYS[1]) == 1 then
    return -2
  end
  return -1
end

if ARGV[3] == '1' then
  -- The owner is the hash's only field (the lock is exclusive), so deleting
  -- the field deletes the hash.
  if redis.call('hdel', KEYS[1], owner) == 0 then
    return not_held()
  end
else
  if redis.call('hexists', KEYS[1], owner) == 0 then
    return not_held()
  end
  local count = redis.call('hincrby', KEYS[1], owner, -1)
  if count > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return count
  end
  redis.call('del', KEYS[1])
end
free_lock(ARGV[4], tonumber(ARGV[5]))
return 0
