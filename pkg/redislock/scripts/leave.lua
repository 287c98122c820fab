-- leave: take a waiter that gave up out of the wait queue, and hand the head
-- position on if it had it. If the lock was handed to the waiter before it
-- could leave, undo that hand-over. KEYS: see lib.lua.
--
-- ARGV[1] owner ID
-- ARGV[2] notice channel prefix
-- ARGV[3] longest lease in ms of a hand-over to the next waiter
--
-- Returns 1 when the owner was queued, 2 when the lock had been handed to it,
-- 0 otherwise.
local owner = ARGV[1]
if redis.call('zscore', KEYS[4], owner) then
  local head = live_head()
  dequeue(owner)
  if head == owner then
    local next = live_head()
    if next then
      local free = '0'
      if redis.call('exists', KEYS[1]) == 0 then
        free = '1'
      end
      notify(ARGV[2], next, free)
    end
  end
  return 1
end
-- Not queued, yet holding: only a hand-over since the waiter's last attempt
-- can have done that. Undo its one level.
if redis.call('hexists', KEYS[1], owner) == 1 then
  if redis.call('hincrby', KEYS[1], owner, -1) <= 0 then
    redis.call('del', KEYS[1])
    free_lock(ARGV[2], tonumber(ARGV[3]))
  end
  return 2
end
return 0
