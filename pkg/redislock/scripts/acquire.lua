-- acquire: take or re-enter the lock for one owner, or queue it. KEYS: see
-- lib.lua, with the request's latch as KEYS[6].
--
-- ARGV[1] lease in ms
-- ARGV[2] owner ID
-- ARGV[3] queue TTL in ms; 0 means do not queue (TryLock without waiting)
-- ARGV[4] notice channel prefix
-- ARGV[5] how long the request's latch is kept, in ms
-- ARGV[6] the client ID whose notice channel reaches the owner
-- ARGV[7] '1' when the attempt follows a release message: the lock was freed
-- ARGV[8] the ticket of the Lock call, '' for one that does not wait: a grant
--         to the call's ticket (see lib.lua) is taken instead of counting a
--         new level, whichever of the call's attempts finds it
--
-- Returns {1, token, count} when the owner holds the lock (count is its
-- reentry count), or {0, pttl, isHead, token} when it does not. pttl is the
-- lock's remaining lease in ms, 0 when the lock is free but reserved for the
-- waiter at the head of the queue, -1 when the lock has no expiry; token is the
-- latest token taken, so the waiter can tell a hand-over to it now (a higher
-- token) from the notice of an earlier one that arrives late. A re-entry
-- answers token 0 if the counter expired (see token_retention): the holder
-- keeps the token it has. Only a taken lock is latched: queueing again is
-- harmless.
local lease, owner, queueTTL, latchTTL = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[5])

local function took(token, count)
  latch(string.format('%d %d', token, count), latchTTL)
  return {1, token, count}
end

local present = redis.call('exists', KEYS[1], KEYS[4])
if present == 0 then
  -- The uncontended case: a free lock and nobody queued.
  redis.call('hset', KEYS[1], owner, 1)
  redis.call('pexpire', KEYS[1], lease)
  return took(next_token(), 1)
end

if redis.call('hexists', KEYS[1], owner) == 1 then
  local done = latched()
  if done then
    -- This request ran before and its reply was lost.
    local token, count = string.match(done, '^(%d+) (%d+)$')
    return {1, tonumber(token), tonumber(count)}
  end
  local count
  if ARGV[8] ~= '' and granted(owner, ARGV[8]) then
    -- The waiter takes the lock given to it: the level the grant made.
    redis.call('hdel', KEYS[5], owner)
    count = tonumber(redis.call('hget', KEYS[1], owner))
  else
    -- Re-entry. It keeps the token of the current ownership: nobody else can
    -- have taken a token since, because nobody else held the lock.
    count = redis.call('hincrby', KEYS[1], owner, 1)
  end
  redis.call('pexpire', KEYS[1], lease)
  return took(current_token(), count)
end

-- Held by another owner, or free with a queue: PTTL tells which (-2, no
-- hash), and is part of the reply when the owner must wait.
local pttl = redis.call('pttl', KEYS[1])
if pttl == -2 then
  -- Free, and only the live head of the queue (if any is left) may take it.
  pttl = 0
  local head, _, _, ticket = live_head()
  -- The head's own call takes it; another call of the same owner (a TryLock,
  -- or another client's Lock) waits its turn like anyone else's.
  if not head or (head == owner and ARGV[8] ~= '' and ticket == ARGV[8]) then
    redis.call('hset', KEYS[1], owner, 1)
    redis.call('pexpire', KEYS[1], lease)
    local token = next_token()
    if head then
      redis.call('zrem', KEYS[4], owner)
      grant(owner, token, ARGV[8])
      local next, _, client = live_head()
      if next then
        notify(ARGV[4], client, next, '0')
      end
    end
    return took(token, 1)
  end
end

if queueTTL > 0 then
  enqueue(owner, lease, queueTTL, ARGV[6], ARGV[8])
end
local isHead = 0
if redis.call('zrange', KEYS[4], 0, 0)[1] == owner then
  isHead = 1
  if ARGV[7] == '1' and pttl > 0 then
    -- The head tried on a release message and found the lock taken: only a
    -- client outside the queue takes a free lock, so the head lost a race
    -- to one, and the queue is owed a turn (see free_lock).
    redis.call('hincrby', KEYS[5], '~owed', 1)
  end
end
return {0, pttl, isHead, current_token()}
