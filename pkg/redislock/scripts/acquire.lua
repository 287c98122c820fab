-- acquire: take or re-enter the lock for one owner.
--
-- KEYS[1] lock hash           <name>
-- KEYS[2] fencing counter     redisson_lock_token:{<name>}
-- KEYS[3] wait queue          lockwarden_lock_queue:{<name>}
-- KEYS[4] wait queue expiry   lockwarden_lock_queue_expiry:{<name>}
-- ARGV[1] lease in ms
-- ARGV[2] owner ID
-- ARGV[3] queue TTL in ms; 0 means do not queue (TryLock without waiting)
-- ARGV[4] notice channel prefix
-- ARGV[5] lock name
--
-- Returns {1, token, count} when the owner holds the lock (count is its
-- reentry count), or {0, pttl, isHead} when it does not. pttl is the lock's
-- remaining lease in ms, 0 when the lock is free but reserved for the waiter at
-- the head of the queue, -1 when the lock has no expiry.
local lease, owner, queueTTL = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])

-- next_token takes the fencing token of a new ownership: one more than the
-- last, or the server clock in microseconds if that is higher. No lock is
-- taken a million times a second, so tokens follow the clock, and when Redis
-- loses the counter or its last increments (a restart without persistence, a
-- crash with appendfsync everysec, a failover to a lagging replica) the next
-- token still rises above every token handed out before.
local function next_token()
  local t = redis.call('time')
  local token = math.max(tonumber(redis.call('get', KEYS[2]) or 0) + 1,
    tonumber(t[1]) * 1000000 + tonumber(t[2]))
  -- %d: Lua would print a number this large in exponent form, which INCR
  -- (a Redisson client's way to take a token) could not read back.
  redis.call('set', KEYS[2], string.format('%d', token))
  return token
end

if redis.call('hexists', KEYS[1], owner) == 1 then
  -- Re-entry keeps the token of the current ownership; nobody else can have
  -- taken a token since, because nobody else held the lock.
  local count = redis.call('hincrby', KEYS[1], owner, 1)
  redis.call('pexpire', KEYS[1], lease)
  return {1, tonumber(redis.call('get', KEYS[2]) or 0), count}
end

local free = redis.call('exists', KEYS[1]) == 0
if free and redis.call('exists', KEYS[3]) == 0 then
  -- The uncontended case: a free lock and nobody queued.
  redis.call('hincrby', KEYS[1], owner, 1)
  redis.call('pexpire', KEYS[1], lease)
  return {1, next_token(), 1}
end

local now = now_ms()
local head = live_head(KEYS[3], KEYS[4], now)

if free and (not head or head == owner) then
  redis.call('hincrby', KEYS[1], owner, 1)
  redis.call('pexpire', KEYS[1], lease)
  local token = next_token()
  if head == owner then
    dequeue(KEYS[3], KEYS[4], owner)
    local next = live_head(KEYS[3], KEYS[4], now)
    if next then
      notify_head(ARGV[4], next, '0', ARGV[5])
    end
  end
  return {1, token, 1}
end

if queueTTL > 0 then
  enqueue(KEYS[3], KEYS[4], owner, queueTTL, now)
  if not head then
    head = owner
  end
end
local isHead = 0
if head == owner then
  isHead = 1
end
local pttl = redis.call('pttl', KEYS[1])
if pttl == -2 then
  pttl = 0
end
return {0, pttl, isHead}
