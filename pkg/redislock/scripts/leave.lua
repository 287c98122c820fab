-- leave: take a Lock call that gave up out of the wait queue, and hand the
-- head position on if it had it. If the lock was given to the call before it
-- could leave (its grant, see lib.lua, is still there), undo exactly that
-- level. KEYS: see lib.lua.
--
-- ARGV[1] owner ID
-- ARGV[2] notice channel prefix
-- ARGV[3] longest lease in ms of a hand-over to the next waiter
-- ARGV[4] the call's ticket: the owner's place or grant is the call's to give
--         up only if it carries this ticket, not another call's of the owner
--
-- Returns 1 when the call was queued, 2 when a grant to it was undone, 0
-- otherwise. Running it twice changes nothing more: the second run finds the
-- call neither queued nor granted.
local owner, ticket = ARGV[1], ARGV[4]
local _, _, queuedTicket = parse_entry(redis.call('hget', KEYS[5], owner))
if redis.call('zscore', KEYS[4], owner) and queuedTicket == ticket then
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
if granted(owner, ticket) then
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
