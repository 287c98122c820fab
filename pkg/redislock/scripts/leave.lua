-- leave: take a Lock call that gave up out of the wait queue, passing the
-- head position on if it had it, and undo the level the lock was given to
-- it with if a hand-over came before it left. KEYS: see lib.lua.
--
-- ARGV[1] owner ID
-- ARGV[2] the call's ticket: the owner's place and level are the call's to
--         give up only if they carry it
-- ARGV[3] '1' to remember the call as finished: a request of it may still
--         arrive late
-- ARGV[4] how long to remember it, ms
--
-- Returns 1 when the call was queued, 2 when a level given to it was undone,
-- 0 otherwise. Running it twice changes nothing more.
local owner, ticket = ARGV[1], ARGV[2]
-- @lib
local prefix = notice_prefix()
local remembered = ''
if ARGV[3] == '1' then
  remembered = ticket
  remember(ticket, ARGV[4])
end
local result = 0
local _, _, _, _, queuedTicket = parse_entry(redis.call('hget', KEYS[5], owner))
if queuedTicket == ticket then
  local wasHead = redis.call('zrank', KEYS[4], owner) == 0
  dequeue(owner)
  if wasHead then
    tell_head(prefix)
  end
  result = 1
end
local f = redis.call('hmget', KEYS[1], owner, '~h' .. ticket, '~q')
if f[1] and level(f[2], owner, ticket) == 'live' then
  undo_level(owner, ticket, tonumber(f[1]), 0, f[3], prefix, remembered, ARGV[4])
  result = 2
end
return result
