-- release: undo one Lock call's level of the owner's hold. KEYS: see lib.lua.
--
-- ARGV[1] owner ID
-- ARGV[2] the call's ticket
-- ARGV[3] the ownership's '~t': a release for an ownership that a newer one
--         of the same owner replaced is refused
-- ARGV[4] tickets (space-separated) of the ownership's calls whose requests
--         may still arrive late: remembered as finished (KEYS[6]) when the
--         lock is freed, and the call's marker is kept at 0 if its ticket
--         is among them; usually empty
-- ARGV[5] how long they are remembered, ms
-- ARGV[6] the calling client's clock, microseconds (see now_us in lib.lua)
--
-- Returns the owner's remaining count (0: the lock was freed, and handed to
-- the next waiter or the release message "0" published); -1 when nobody
-- holds the lock, -2 when another owner does, -3 when a newer ownership of
-- this owner does: nothing is changed then. Run twice, it changes nothing
-- more: a call whose level is already undone gets the remaining count, and
-- one whose first run freed the lock gets 0 (see freed_by in lib.lua),
-- whoever holds the lock now.
local owner, ticket = ARGV[1], ARGV[2]
local f = redis.call('hmget', KEYS[1], owner, '~t', '~q', '~h' .. ticket, '~a')

-- The uncontended case: the last level, nobody queued, nothing to remember.
if f[1] == '1' and f[2] == ARGV[3] and not f[3] and ARGV[4] == '' and
    (f[4] == '1' or not f[4] and ticket == owner) then
  redis.call('rename', KEYS[1], KEYS[7])
  redis.pcall('__PUBLISH__', KEYS[2], '0')
  return 0
end

-- @lib
use_clock(ARGV[6])

if not f[1] or f[2] ~= ARGV[3] then
  remember(ARGV[4], ARGV[5])
  if freed_by(owner, ticket, ARGV[3]) then
    return 0
  elseif f[1] then
    return -3
  elseif redis.call('exists', KEYS[1]) == 1 then
    return -2
  end
  return -1
end
if level(f[4], owner, ticket) ~= 'live' then
  return tonumber(f[1])
end
return undo_level(owner, ticket, tonumber(f[1]), tonumber(f[5] or '0'), f[3], notice_prefix(), ARGV[4], ARGV[5])
