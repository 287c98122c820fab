-- force_release: drop every hold and queue entry whose owner ID starts with a
-- prefix (a pod UID), whatever its reentry count. The controller's call when
-- a pod terminates. KEYS: see lib.lua.
--
-- ARGV[1] owner ID prefix
-- ARGV[2] a fencing token, or "": if given, nothing is removed unless the
--         lock's ownership is the one with that token (ForceReleaseOwnership)
--
-- Returns the number of holders removed. When that empties the lock, it is
-- handed to the next waiter, or the release message "0" published. A second
-- run removes nothing more.
local prefix = ARGV[1]
if ARGV[2] ~= '' then
  local t = redis.call('hget', KEYS[1], '~t')
  if not t or string.match(t, '^%d+') ~= ARGV[2] then
    return 0
  end
end
-- @lib
local function owned(id)
  return string.sub(id, 1, 1) ~= '~' and string.sub(id, 1, #prefix) == prefix
end

for _, id in ipairs(redis.call('hkeys', KEYS[5])) do
  if owned(id) then
    dequeue(id)
  end
end

local removed, others = {}, false
for _, id in ipairs(redis.call('hkeys', KEYS[1])) do
  if owned(id) then
    removed[#removed + 1] = id
  elseif string.sub(id, 1, 1) ~= '~' then
    others = true
  end
end
if #removed == 0 then
  return 0
end
if others then
  -- Not a hash these scripts made: they never give a lock two owners.
  redis.call('hdel', KEYS[1], unpack(removed))
else
  local queued = redis.call('hexists', KEYS[1], '~q') == 1
  redis.call('del', KEYS[1])
  if queued or redis.call('exists', KEYS[4]) == 1 then
    free_lock(notice_prefix())
  else
    publish(KEYS[2], '0')
  end
end
return #removed
