-- leave: take a waiter that gave up out of the wait queue, and hand the head
-- position on if it had it. If the lock was given to the waiter before it
-- could leave (its grant, see lib.lua, is still there), undo exactly that
-- level. KEYS: see lib.lua.
--
-- ARGV[1] owner ID
-- ARGV[2] notice channel prefix
-- ARGV[3] longest lease in ms of a hand-over to the next waiter
--
-- Returns 1 when the owner was queued, 2 when a grant to it was undone, 0
-- otherwise. Running it twice changes nothing more: the second run finds the
-- owner neither queued nor granted.
local owner = ARGV[1]
if redis.call('zscore', KEYS[4], owner) then
  local head = live_head()
  dequeue(owner)
  if head == owner then
    local next, _, client = live_head()
    if next then
      local free = '0'
      if redis.call('exists', KEYS[1]) == 0 then
        free = '1'
      end
      notify(ARGV[2], client, next, free)
    end
  end
  return 1
end
if granted(owner) then
  redis.call('hdel', KEYS[5], owner)
  local count = tonumber(redis.call('hget', KEYS[1], owner))
  if count then
    if count > 1 then
      -- A re-entry by the same owner came on top of the grant: keep it.
      redis.call('hincrby', KEYS[1], owner, -1)
    else
      redis.call('del', KEYS[1])
      free_lock(ARGV[2], tonumber(ARGV[3]))
    end
    return 2
  end
end
return 0
