-- acquire: take the lock for an owner, re-enter it, or queue the call.
-- KEYS: see lib.lua.
--
-- ARGV[1] owner ID
-- ARGV[2] the call's ticket: the same for every request of one Lock call
-- ARGV[3] the calling client's clock, microseconds: a new ownership's token
--         if above the counter (see next_token)
-- ARGV[4] lease terms (see '~l' in lib.lua)
-- ARGV[5] lease, ms
-- ARGV[6] the client's queue TTL, ms; 0 for a call that does not wait
--         (TryLock(ctx, 0)): it takes a lock it finds free, whoever queues,
--         as Redisson's tryLock does, and otherwise queues nothing
-- ARGV[7] the client ID, which names its notice channel
-- ARGV[8] notice channel prefix, "lockwarden_lock__notice:{<name>}:"
-- ARGV[9] how many release messages the head of the queue heard since its
--         last attempt: each was a race it did not win (see races)
--
-- Returns the ownership's token (above 0) when the owner holds the lock with
-- a level for the call; -1 when the owner holds it under other lease terms;
-- -2 when the call is finished (see KEYS[6]); or, when the owner must wait,
-- {pttl, rank, token, lapse}: the lock's remaining lease in ms (0 when it is
-- free but the queue's head may take it first, -1 when it has no expiry),
-- the call's place in the queue from 0 (-1: not queued), the holder's token
-- (0 if not lockwarden's), and in ms how soon the entry ahead of a call
-- second in line lapses if its waiter does not refresh it (-1 otherwise).

-- The uncontended case: a free lock, nobody queued, no call remembered.
if redis.call('exists', KEYS[1], KEYS[4], KEYS[6]) == 0 then
  local token = ARGV[3]
  local last = tonumber(redis.call('set', KEYS[3], token, 'get') or '0') or 0
  if last >= tonumber(token) then
    token = string.format('%d', last + 1)
    redis.call('set', KEYS[3], token)
  end
  redis.call('hset', KEYS[1], ARGV[1], 1, '~t', token, '~l', ARGV[4], '~h' .. ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[5])
  return tonumber(token)
end

-- @lib

local owner, ticket, terms = ARGV[1], ARGV[2], ARGV[4]
local f = redis.call('hmget', KEYS[1], owner, '~t', '~l', '~h' .. ticket, '~q')
if f[1] then
  if f[4] then
    -- The call's level is there: an earlier send of this request took it,
    -- or a release handed the lock to the call, with a lease that may be
    -- short (see free_lock) and started before this request was sent. The
    -- lease is renewed, so that it lasts from this request on: the client
    -- counts from its send. A level already undone (0) is left alone.
    if f[4] == '1' then
      redis.call('pexpire', KEYS[1], ARGV[5])
    end
    return tonumber(f[2]) or 0
  end
  if finished(ticket) then
    return -2
  end
  if f[3] ~= terms then
    return -1
  end
  -- A re-entry: it keeps the ownership's token.
  redis.call('hincrby', KEYS[1], owner, 1)
  redis.call('hset', KEYS[1], '~h' .. ticket, 1)
  redis.call('pexpire', KEYS[1], ARGV[5])
  return tonumber(f[2]) or 0
end

local pttl = redis.call('pttl', KEYS[1])
local held = pttl ~= -2
if not held then
  -- Free, with a queue or finished calls: the live head of the queue takes
  -- it, or anyone if nobody is queued, or a call that does not wait. After
  -- a race (see races in lib.lua), the head leaves it to others for a
  -- moment: pttl tells it how long.
  pttl = 0
  local head, _, headTicket = live_head()
  local mine = head == owner and headTicket == ticket
  if mine then
    local grace = (tonumber(redis.call('hget', KEYS[5], '~grace') or '') or 0) - now_ms()
    if grace > 0 then
      mine, pttl = false, grace
    end
  end
  if not head or mine or ARGV[6] == '0' then
    if finished(ticket) then
      return -2
    end
    if mine then
      dequeue(owner)
      if tonumber(ARGV[9]) > 1 then
        -- It heard of releases before this one: someone else took the
        -- lock after each (see races).
        redis.call('hincrby', KEYS[5], '~owed', ARGV[9] - 1)
      end
    end
    local token = next_token(ARGV[3])
    redis.call('hset', KEYS[1], owner, 1, '~t', token, '~l', terms, '~h' .. ticket, 1)
    if redis.call('exists', KEYS[4]) == 1 then
      redis.call('hset', KEYS[1], '~q', 1)
      if mine then
        redis.call('hdel', KEYS[5], '~racing')
        tell_head(ARGV[8])
      end
    end
    redis.call('pexpire', KEYS[1], ARGV[5])
    return tonumber(token)
  end
end

-- Held by another owner, or free for the head of the queue: wait.
local foreign = held and not f[2]
local ttl = tonumber(ARGV[6])
if ttl == 0 then
  return {pttl, -1, tonumber(f[2]) or 0, -1}
end
local now = now_ms()
redis.call('zadd', KEYS[4], 'nx', now_us(), owner)
redis.call('hset', KEYS[5], owner, string.format('%d %s %d %s %s %s', now + ttl, ARGV[5], ttl, ARGV[7], ticket, terms))
-- Both queue keys live two queue TTLs past the last refresh, and no waiter
-- shortens what another's refresh set.
local left = redis.call('pttl', KEYS[4])
if left < 3 * ttl / 2 then
  redis.call('pexpire', KEYS[4], 2 * ttl)
  if redis.call('pttl', KEYS[5]) < 2 * ttl then
    redis.call('pexpire', KEYS[5], 2 * ttl)
  end
end
if held and not foreign and not f[5] then
  redis.call('hset', KEYS[1], '~q', 1)
end
if foreign then
  redis.call('hset', KEYS[5], '~foreign', now, '~probe', string.format('%d %d', now, probe_first / 2))
end
local rank = redis.call('zrank', KEYS[4], owner)
local lapse = -1
if rank == 0 and foreign and (ARGV[9] ~= '0' or redis.call('hget', KEYS[5], '~racing') == owner) then
  -- The head tried on release messages, or after a race release, and
  -- found a Redisson client holding the lock: it lost each race, and the
  -- queue is owed a turn for each (see races).
  redis.call('hincrby', KEYS[5], '~owed', math.max(tonumber(ARGV[9]), 1))
  redis.call('hdel', KEYS[5], '~racing')
elseif rank == 1 then
  local ahead = parse_entry(redis.call('hget', KEYS[5], redis.call('zrange', KEYS[4], 0, 0)[1]))
  if ahead then
    lapse = math.max(ahead - now, 0)
  end
end
return {pttl, rank, tonumber(f[2]) or 0, lapse}
