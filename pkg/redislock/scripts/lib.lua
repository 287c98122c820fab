-- Shared helpers, prepended to the scripts that take tokens or use the wait
-- queue. Every such script gets the same KEYS:
--
-- KEYS[1] lock hash            <name>
-- KEYS[2] release channel      redisson_lock__channel:{<name>}
-- KEYS[3] fencing counter      redisson_lock_token:{<name>}
-- KEYS[4] wait queue           lockwarden_lock_queue:{<name>}
-- KEYS[5] wait queue entries   lockwarden_lock_queue_entry:{<name>}
--
-- The queue is lockwarden's own addition to Redisson's layout: a sorted set of
-- waiting owner IDs scored by arrival time (KEYS[4]), and a hash from each to
-- "<expiry ms> <lease ms>" (KEYS[5]): when its entry lapses, and the lease it
-- asked for. A waiter that stops refreshing its entry (a crashed process) is
-- pruned once its entry lapses. Redisson clients ignore the queue: they take
-- the lock when it is free, which it never is while a live waiter is queued,
-- because a release hands the lock straight to the head of the queue.

-- server_us is the server clock in microseconds, read once per script run.
local server_clock
local function server_us()
  if not server_clock then
    local t = redis.call('time')
    server_clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return server_clock
end

local function now_ms()
  return math.floor(server_us() / 1000)
end

-- next_token takes the fencing token of a new ownership: one more than the
-- last, or the server clock in microseconds if that is higher. No lock is
-- taken a million times a second, so tokens follow the clock, and when Redis
-- loses the counter or its last increments (a restart without persistence, a
-- crash with appendfsync everysec, a failover to a lagging replica) the next
-- token still rises above every token handed out before.
local function next_token()
  local clock = server_us()
  -- %d: Lua would print a number this large in exponent form, which INCR
  -- (a Redisson client's way to take a token) could not read back.
  local last = tonumber(redis.call('set', KEYS[3], string.format('%d', clock), 'get') or 0)
  if last < clock then
    return clock
  end
  redis.call('set', KEYS[3], string.format('%d', last + 1))
  return last + 1
end

local function dequeue(owner)
  redis.call('zrem', KEYS[4], owner)
  redis.call('hdel', KEYS[5], owner)
end

-- live_lease returns the lease a queue entry asked for, or nil once the
-- entry lapsed (its waiter stopped refreshing it) or if there is none.
local function live_lease(entry)
  local expiry, lease = string.match(entry or '', '^(%d+) (%d+)$')
  if expiry and tonumber(expiry) > now_ms() then
    return tonumber(lease)
  end
end

-- live_head drops lapsed entries from the front of the queue and returns the
-- live head and the lease it asked for, or false when nobody waits.
local function live_head()
  while true do
    local head = redis.call('zrange', KEYS[4], 0, 0)[1]
    if not head then
      return false
    end
    local lease = live_lease(redis.call('hget', KEYS[5], head))
    if lease then
      return head, lease
    end
    dequeue(head)
  end
end

-- pop_live_head is live_head, but also takes the head it returns off the
-- queue: one ZPOPMIN instead of a ZRANGE and a ZREM.
local function pop_live_head()
  while true do
    local head = redis.call('zpopmin', KEYS[4])[1]
    if not head then
      return false
    end
    local lease = live_lease(redis.call('hget', KEYS[5], head))
    redis.call('hdel', KEYS[5], head)
    if lease then
      return head, lease
    end
  end
end

-- enqueue adds the owner at the tail of the queue, or refreshes its entry if
-- it is queued.
local function enqueue(owner, lease, ttl)
  redis.call('zadd', KEYS[4], 'nx', server_us(), owner)
  redis.call('hset', KEYS[5], owner, string.format('%d %d', now_ms() + ttl, lease))
end

-- notify sends a waiter a notice on its client's notice channel, derived from
-- the owner ID "<clientID>:<n>": "<kind> <owner> <name>[ <more>]", where the
-- name is the lock's, KEYS[1]. Kinds: '1', the waiter heads the queue of a
-- free lock and should try at once; '0', it heads the queue of a held lock
-- and should try on the release message; 'g', the lock was handed to it, with
-- the token and lease (ms) that follow.
local function notify(prefix, owner, kind, more)
  local clientID = string.match(owner, '^(.*):[^:]*$')
  if clientID then
    local msg = kind .. ' ' .. owner .. ' ' .. KEYS[1]
    if more then
      msg = msg .. ' ' .. more
    end
    redis.call('publish', prefix .. clientID, msg)
  end
end

-- free_lock runs once the lock's hash is gone: its last holder released it
-- and the caller deleted what was left. It hands the lock to the live head of
-- the queue, if there is one: the head holds it at once, with a new token, and
-- is told so. Its lease is what it asked for, but at most claimTTL, so a
-- waiter that died while queued holds up the lock for no longer than that; a
-- live one extends its lease once it has the notice. With nobody queued, the
-- release message is published.
local function free_lock(prefix, claimTTL)
  local head, lease = pop_live_head()
  if not head then
    redis.call('publish', KEYS[2], '0')
    return
  end
  lease = math.min(lease, claimTTL)
  redis.call('hset', KEYS[1], head, 1)
  redis.call('pexpire', KEYS[1], lease)
  notify(prefix, head, 'g', string.format('%d %d', next_token(), lease))
end
