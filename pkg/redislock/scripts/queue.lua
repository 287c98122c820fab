-- Shared helpers for the FIFO wait queue, prepended to the scripts that use it.
--
-- The queue is lockwarden's own addition to Redisson's layout: a sorted set of
-- waiting owner IDs ordered by arrival (queueKey) and a sorted set of their
-- expiry times (expiryKey). A waiter that stops refreshing its entry (a crashed
-- process) is pruned once its entry expires, so it can stall a free lock for at
-- most the queue TTL. Redisson clients ignore the queue; they may barge in.

local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Drops expired entries from the front of the queue and returns the live head
-- (or false when the queue is empty).
local function live_head(queueKey, expiryKey, now)
  while true do
    local head = redis.call('zrange', queueKey, 0, 0)[1]
    if not head then
      return false
    end
    local expiry = tonumber(redis.call('zscore', expiryKey, head))
    if expiry and expiry > now then
      return head
    end
    redis.call('zrem', queueKey, head)
    redis.call('zrem', expiryKey, head)
  end
end

-- Adds the owner at the tail of the queue, or refreshes its expiry if queued.
local function enqueue(queueKey, expiryKey, owner, ttl, now)
  if not redis.call('zscore', queueKey, owner) then
    local tail = redis.call('zrange', queueKey, -1, -1, 'withscores')
    local seq = 1
    if tail[2] then
      seq = tonumber(tail[2]) + 1
    end
    redis.call('zadd', queueKey, seq, owner)
  end
  redis.call('zadd', expiryKey, now + ttl, owner)
end

local function dequeue(queueKey, expiryKey, owner)
  redis.call('zrem', queueKey, owner)
  redis.call('zrem', expiryKey, owner)
end

-- Tells a waiter, on its client's notice channel, that it is now the head of
-- the queue. free is '1' when the lock is free, so the waiter should try at
-- once; '0' when it is held, so the waiter waits for the release message.
-- The channel is derived from the owner ID "<clientID>:<n>".
local function notify_head(prefix, head, free, name)
  local clientID = string.match(head, '^(.*):[^:]*$')
  if clientID then
    redis.call('publish', prefix .. clientID, free .. ' ' .. head .. ' ' .. name)
  end
end
