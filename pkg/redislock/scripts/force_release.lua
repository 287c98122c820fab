-- force_release: drop every hold and queue entry whose owner ID starts with a
-- prefix (a pod UID), whatever its reentry count. The controller's call when a
-- pod terminates.
--
-- KEYS[1] lock hash           <name>
-- KEYS[2] release channel     redisson_lock__channel:{<name>}
-- KEYS[3] wait queue          lockwarden_lock_queue:{<name>}
-- KEYS[4] wait queue expiry   lockwarden_lock_queue_expiry:{<name>}
-- ARGV[1] owner ID prefix
--
-- Returns the number of holders removed. When that empties the lock, the lock
-- is deleted and the release message "0" is published.
local prefix = ARGV[1]
local function owned(id)
  return string.sub(id, 1, #prefix) == prefix
end

for _, id in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
  if owned(id) then
    dequeue(KEYS[3], KEYS[4], id)
  end
end

local removed = 0
for _, id in ipairs(redis.call('hkeys', KEYS[1])) do
  if owned(id) then
    redis.call('hdel', KEYS[1], id)
    removed = removed + 1
  end
end
if removed > 0 and redis.call('hlen', KEYS[1]) == 0 then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[2], '0')
end
return removed
