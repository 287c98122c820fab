-- acquire: take the lock for an owner, re-enter it, or queue the call.
-- KEYS: see lib.lua. (The uncontended Lock of an owner of its own first
-- tries take.lua, which is cheaper to call.)
--
-- ARGV[1] owner ID
-- ARGV[2] the call's ticket: the same for every request of one Lock call
-- ARGV[3] the calling client's clock, microseconds: a new ownership's token
--         if above the counter (see next_token)
-- ARGV[4] lease terms (see '~t' in lib.lua)
-- ARGV[5] the client's queue TTL, ms; 0 for a call that does not wait
--         (TryLock(ctx, 0)): it takes a lock it finds free, whoever queues,
--         as Redisson's tryLock does, and otherwise queues nothing
-- ARGV[6] the client ID, which names its notice channel
-- ARGV[7] how many release messages the head of the queue heard since its
--         last attempt: each was a race it did not win (see races)
-- ARGV[8] for a re-entry of a hold the caller carries (WithHold), that
--         ownership's token: the call re-enters it or nothing, never takes
--         the lock anew; "" otherwise
--
-- Returns the ownership's token (above 0) when the owner holds the lock with
-- a level for the call; -1 when the owner holds it under other lease terms;
-- -2 when the call is finished (see KEYS[6]); -3 when the ownership a
-- re-entry names no longer holds the lock; or, when the owner must wait,
-- {pttl, rank, token, lapse}: the lock's remaining lease in ms, or for a
-- lockwarden holder at most that (its lease); 0 when it is free but the
-- queue's head may take it first, or for how long the head leaves it to
-- others; -1 when it has no expiry; the call's place in the
-- queue from 0 (-1: not queued), the holder's token (0 if not lockwarden's),
-- and in ms how soon every entry ahead of the call lapses if their waiters
-- do not refresh them (-1 for the head, or a call too far back to look;
-- -2 for a call just queued behind others, which it has not looked at).
-- Entries ahead that have lapsed are dropped first: a waiter that died
-- while queued holds up nobody behind it, whether the lock is held or free.
local owner, ticket, terms = ARGV[1], ARGV[2], ARGV[4]
local lease = string.match(terms, '^(%d+)')

-- @lib
use_clock(ARGV[3])

local f = redis.call('hmget', KEYS[1], owner, '~t', '~h' .. ticket, '~q')
if ARGV[8] ~= '' and not (f[1] and token_of(f[2]) == tonumber(ARGV[8])) then
  return -3
end
if f[1] then
  local mine = level(f[3], owner, ticket)
  if mine then
    -- The call's level is there: an earlier send of this request took it,
    -- or a release handed the lock to the call, with a lease that may be
    -- short (see free_lock) and started before this request was sent. The
    -- lease is renewed, so that it lasts from this request on: the client
    -- counts from its send. A level already undone is left alone.
    if mine == 'live' then
      redis.call('pexpire', KEYS[1], lease)
    end
    return token_of(f[2]) or 0
  end
  if finished(ticket) then
    return -2
  end
  if not f[2] then
    -- Held under this owner without '~t': taken by a lockwarden from before
    -- that field (its manager's grants, across an upgrade), which kept the
    -- ownership's token in the counter, as Redisson does. The re-entry
    -- adopts it under the caller's terms, with that token.
    local token = redis.call('get', KEYS[3])
    if not (token and string.match(token, '^%d+$')) then
      token = next_token(now_text())
    end
    redis.call('hincrby', KEYS[1], owner, 1)
    redis.call('hset', KEYS[1], '~t', token .. ' ' .. terms, '~h' .. ticket, '1')
    redis.call('pexpire', KEYS[1], lease)
    return tonumber(token)
  end
  if terms_of(f[2]) ~= terms then
    return -1
  end
  -- A re-entry: it keeps the ownership's token.
  redis.call('hincrby', KEYS[1], owner, 1)
  redis.call('hset', KEYS[1], '~h' .. ticket, '1')
  redis.call('pexpire', KEYS[1], lease)
  return token_of(f[2]) or 0
end

-- A lockwarden holder's terms bound what is left of its lease, which the
-- caller only needs as a bound on how long to sleep; anyone else's is read.
local pttl = tonumber(lease_of(terms_of(f[2]) or '') or '')
if not pttl then
  pttl = redis.call('pttl', KEYS[1])
end
local held = pttl ~= -2
if not held then
  -- Free, with a queue or finished calls: the live head of the queue takes
  -- it, or anyone if nobody is queued, or a call that does not wait. After
  -- a race (see races in lib.lua), the head leaves it to others for a
  -- moment: pttl tells it how long.
  pttl = 0
  local head, _, headTicket = live_head()
  local mine = head == owner and headTicket == ticket
  local race
  if mine then
    race = redis.call('hmget', KEYS[5], '~grace', '~racing', '~wait')
    -- (At most race_grace_most: the release's clock may be ahead of this
    -- one.)
    local grace = (tonumber(race[1] or '') or 0) - now_ms()
    if grace > 0 then
      mine, pttl = false, math.min(grace, race_grace_most)
    end
  end
  if not head or mine or ARGV[5] == '0' then
    if finished(ticket) then
      return -2
    end
    if mine then
      dequeue(owner)
      if tonumber(ARGV[7]) > 1 then
        -- It heard of releases before this one: someone else took the
        -- lock after each (see races).
        redis.call('hincrby', KEYS[5], '~owed', ARGV[7] - 1)
      elseif race[2] == owner then
        -- Its race ended with nobody outside the queue taking the lock:
        -- the next race waits longer for those that still listen, or
        -- starts over if nobody does (see race_grace).
        if outsiders(notice_prefix()) == false then
          redis.call('hdel', KEYS[5], '~wait')
        else
          local wait = tonumber(race[3] or '') or race_grace
          redis.call('hset', KEYS[5], '~wait', math.min(2 * wait, race_grace_most))
        end
      end
    end
    local token = next_token(now_text())
    local fields = {owner, '1', '~t', token .. ' ' .. terms}
    if ticket ~= owner then
      fields[#fields + 1], fields[#fields + 2] = '~h' .. ticket, '1'
    end
    local queued = redis.call('exists', KEYS[4]) == 1
    if queued then
      fields[#fields + 1], fields[#fields + 2] = '~q', '1'
    end
    redis.call('hset', KEYS[1], unpack(fields))
    redis.call('pexpire', KEYS[1], lease)
    if mine and race[2] then
      redis.call('hdel', KEYS[5], '~racing')
    end
    if mine and queued then
      tell_head(notice_prefix())
    end
    return tonumber(token)
  end
end

-- Held by another owner, or free for the head of the queue: wait.
local foreign = held and not f[2]
local ttl = tonumber(ARGV[5])
if ttl == 0 then
  return {pttl, -1, token_of(f[2]) or 0, -1}
end
local now = now_ms()
local again = redis.call('zadd', KEYS[4], 'nx', now_us(), owner) == 0
redis.call('hset', KEYS[5], owner, string.format('%d %s %d %s %s %s', now + ttl, lease, ttl, ARGV[6], ticket, terms))
-- Both queue keys live two queue TTLs past the last refresh, and no waiter
-- shortens what another's refresh set.
local left = redis.call('pttl', KEYS[4])
if left < 3 * ttl / 2 then
  redis.call('pexpire', KEYS[4], 2 * ttl)
  if redis.call('pttl', KEYS[5]) < 2 * ttl then
    redis.call('pexpire', KEYS[5], 2 * ttl)
  end
end
if held and not foreign and not f[4] then
  redis.call('hset', KEYS[1], '~q', '1')
end
if foreign then
  redis.call('hset', KEYS[5], '~foreign', now, '~probe', string.format('%d %d', now, probe_first / 2))
end
-- The call's place, from the front of the queue, which also names the
-- entries ahead of it (past lookahead, ZRANK tells the place alone).
local front = redis.call('zrange', KEYS[4], 0, lookahead)
local rank
for i, id in ipairs(front) do
  if id == owner then
    rank = i - 1
    break
  end
end
rank = rank or redis.call('zrank', KEYS[4], owner)
-- Drop the entries ahead that lapsed; the call learns how soon the rest
-- lapse unless refreshed, when it would head the queue. A call just queued
-- looks only at the head, and only when it is second: further back it
-- learns it on its next attempt, or retries on a release message before
-- that (lapse -2, see released in waiting.go).
local lapse = -1
if rank > 0 and rank <= lookahead then
  local ahead = {front[1]}
  if again then
    ahead = {unpack(front, 1, rank)}
  elseif rank > 1 then
    ahead, lapse = {}, -2
  end
  if #ahead > 0 then
    local entries = redis.call('hmget', KEYS[5], unpack(ahead))
    for i, id in ipairs(ahead) do
      local at = parse_entry(entries[i])
      if at and at > now then
        lapse = math.max(lapse, at - now)
      else
        dequeue(id)
        rank = rank - 1
      end
    end
  end
end
if rank == 0 and foreign and (ARGV[7] ~= '0' or redis.call('hget', KEYS[5], '~racing') == owner) then
  -- The head tried on release messages, or after a race release, and
  -- found a Redisson client holding the lock: it lost each race, and the
  -- queue is owed a turn for each (see races).
  redis.call('hincrby', KEYS[5], '~owed', math.max(tonumber(ARGV[7]), 1))
  redis.call('hdel', KEYS[5], '~racing')
end
return {pttl, rank, token_of(f[2]) or 0, lapse}
