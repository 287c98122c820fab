-- force_release: drop every hold and queue entry whose owner ID starts with a
-- prefix (a pod UID), whatever its reentry count. The controller's call when a
-- pod terminates. KEYS: see lib.lua.
--
-- ARGV[1] owner ID prefix
-- ARGV[2] notice channel prefix
-- ARGV[3] longest lease in ms of a hand-over to the next waiter
--
-- Returns the number of holders removed. When that empties the lock, it is
-- handed to the next waiter, or deleted and the release message "0"
-- published. A second run removes nothing more.
local prefix = ARGV[1]
local function owned(id)
  return string.sub(id, 1, #prefix) == prefix
end

-- Queue entries and grants alike: every field of the entries hash is an owner.
for _, id in ipairs(redis.call('hkeys', KEYS[5])) do
  if owned(id) then
    dequeue(id)
  end
end

local removed = 0
for _, id in ipairs(redis.call('hkeys', KEYS[1])) do
  if owned(id) then
    redis.call('hdel', KEYS[1], id)
    removed = removed + 1
  end
end
-- Removing the last field deleted the hash.
if removed > 0 and redis.call('exists', KEYS[1]) == 0 then
  free_lock(ARGV[2], tonumber(ARGV[3]))
end
return removed
