-- release: undo one level of the owner's hold on the lock. KEYS: see lib.lua,
-- with the request's latch as KEYS[6].
--
-- ARGV[1] owner ID
-- ARGV[2] lease in ms, restored while re-entries remain
-- ARGV[3] notice channel prefix
-- ARGV[4] longest lease in ms a hand-over grants before the new holder
--         extends it (the releasing client's queue TTL)
-- ARGV[5] how long the request's latch is kept, in ms
-- ARGV[6] the ticket of the Lock call the ownership began with, '' if it did
--         not wait: a grant to that call still recorded is cleared
-- ARGV[7] the fencing token of the ownership the release is for, or 0 if not
--         known: a release for an ownership that a newer one replaced (the
--         lock was force-released and taken again by the same owner) is
--         refused as not the owner's
--
-- Returns the owner's remaining reentry count (0: the lock was handed to the
-- next waiter, or freed and the release message "0" published), -1 when the
-- lock is not held by anyone, or -2 when it is held by another owner. In both
-- negative cases nothing is changed. A second run of the same request answers
-- as the first did and changes nothing.
local owner, latchTTL = ARGV[1], tonumber(ARGV[5])
local done = latched()
if done then
  return tonumber(done)
end

local count = tonumber(redis.call('hget', KEYS[1], owner))
if not count then
  if redis.call('exists', KEYS[1]) == 1 then
    return -2
  end
  return -1
end
if ARGV[7] ~= '0' then
  -- Every new ownership takes a token, so the counter holds the current
  -- ownership's, unless it expired (see token_retention).
  local current = redis.call('get', KEYS[3])
  if current and current ~= ARGV[7] then
    return -2
  end
end
-- The call the ownership began with is done waiting: a grant still recorded
-- for it (taken from its notice, or by an attempt the caller then gave up)
-- goes now, whatever level this is, so that no leave undoes a level for it.
if ARGV[6] ~= '' and granted(owner, ARGV[6]) then
  redis.call('hdel', KEYS[5], owner)
end
if count > 1 then
  redis.call('hincrby', KEYS[1], owner, -1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  latch(count - 1, latchTTL)
  return count - 1
end
-- The lock is exclusive: deleting the hash removes the owner's field and any
-- other that should not be there.
redis.call('del', KEYS[1])
free_lock(ARGV[3], tonumber(ARGV[4]))
latch(0, latchTTL)
return 0
