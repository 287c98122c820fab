-- Shared helpers, prepended to every script but renew.lua. Every such script
-- gets the same KEYS:
--
-- KEYS[1] lock hash            <name>
-- KEYS[2] release channel      redisson_lock__channel:{<name>}
-- KEYS[3] fencing counter      redisson_lock_token:{<name>}
-- KEYS[4] wait queue           lockwarden_lock_queue:{<name>}
-- KEYS[5] wait queue entries   lockwarden_lock_queue_entry:{<name>}
-- KEYS[6] request latch        lockwarden_lock_request:{<name>}:<request ID>
--         (acquire and release only)
--
-- The queue is lockwarden's own addition to Redisson's layout: a sorted set of
-- waiting owner IDs scored by arrival time (KEYS[4]), and a hash (KEYS[5])
-- from each to "<expiry ms> <lease ms> <client ID> <ticket>": when its entry
-- lapses, the lease it asked for, the client whose notice channel reaches it,
-- and the ticket of the Lock call that waits (a call's own ID: calls of one
-- owner from two clients share the owner's place, not its grants). A waiter
-- that stops refreshing its entry (a crashed process) is pruned once its entry
-- lapses. Both keys expire when no waiter has refreshed them for two queue
-- TTLs, so an abandoned queue costs no memory for long.
--
-- When a queued call is given the lock (a hand-over, or its own attempt), its
-- entry becomes a grant, "g <token> <ticket>", until that call takes it. The
-- grant is what lets the call's retry take the lock without counting a
-- second level, and a call that gave up undo exactly that level; only the
-- call with the grant's ticket can do either.
--
-- The request latch makes acquire and release safe to run twice: go-redis
-- resends a command whose reply was lost, and so does the client (see
-- request.go). The first run stores its result under the request's own key;
-- a second run finds it there and answers the same, changing nothing.

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

-- How long a fencing counter outlives its last token, in ms. Tokens follow
-- the server clock (see next_token), so a counter that expired while its lock
-- was idle loses nothing: the next token is the clock, above every earlier
-- one.
local token_retention = 86400000

-- next_token takes the fencing token of a new ownership: one more than the
-- last, or the server clock in microseconds if that is higher. No lock is
-- taken a million times a second, so tokens follow the clock, and when Redis
-- loses the counter or its last increments (a restart without persistence, a
-- crash with appendfsync everysec, a failover to a lagging replica, or the
-- counter's own expiry) the next token still rises above every token handed
-- out before.
local function next_token()
  local clock = server_us()
  -- %d: Lua would print a number this large in exponent form, which INCR
  -- (a Redisson client's way to take a token) could not read back.
  local last = tonumber(redis.call('set', KEYS[3], string.format('%d', clock), 'get', 'px', token_retention) or 0)
  if last < clock then
    return clock
  end
  redis.call('set', KEYS[3], string.format('%d', last + 1), 'px', token_retention)
  return last + 1
end

-- current_token is the latest token taken, 0 if the counter is gone.
local function current_token()
  return tonumber(redis.call('get', KEYS[3]) or 0)
end

-- latched returns what the first run of this request stored, if it ran.
local function latched()
  return redis.call('get', KEYS[6])
end

-- latch stores this request's result for its retries, for ttl ms.
local function latch(result, ttl)
  redis.call('set', KEYS[6], result, 'px', ttl)
end

local function dequeue(owner)
  redis.call('zrem', KEYS[4], owner)
  redis.call('hdel', KEYS[5], owner)
end

-- parse_entry returns a queue entry's lease, client ID and ticket, and
-- whether it is live: not lapsed (its waiter stopped refreshing it), not a
-- grant. Entries of older clients name no client or ticket.
local function parse_entry(entry)
  local expiry, lease, client, ticket = string.match(entry or '', '^(%d+) (%d+) ?(%S*) ?(%S*)$')
  if expiry then
    return tonumber(lease), client, ticket, tonumber(expiry) > now_ms()
  end
end

-- live_head drops lapsed entries from the front of the queue and returns the
-- live head, the lease it asked for, its client ID and its ticket, or false
-- when nobody waits.
local function live_head()
  while true do
    local head = redis.call('zrange', KEYS[4], 0, 0)[1]
    if not head then
      return false
    end
    local lease, client, ticket, live = parse_entry(redis.call('hget', KEYS[5], head))
    if live then
      return head, lease, client, ticket
    end
    dequeue(head)
  end
end

-- pop_live_head is live_head, but also takes the head it returns off the
-- queue: one ZPOPMIN instead of a ZRANGE and a ZREM. The head's entry is left
-- for the caller to turn into a grant.
local function pop_live_head()
  while true do
    local head = redis.call('zpopmin', KEYS[4])[1]
    if not head then
      return false
    end
    local lease, client, ticket, live = parse_entry(redis.call('hget', KEYS[5], head))
    if live then
      return head, lease, client, ticket
    end
    redis.call('hdel', KEYS[5], head)
  end
end

-- enqueue adds the owner at the tail of the queue, or refreshes its entry if
-- it is queued, for the call with ticket, and keeps both queue keys alive for
-- two queue TTLs.
local function enqueue(owner, lease, ttl, client, ticket)
  redis.call('zadd', KEYS[4], 'nx', server_us(), owner)
  redis.call('hset', KEYS[5], owner, string.format('%d %d %s %s', now_ms() + ttl, lease, client, ticket))
  redis.call('pexpire', KEYS[4], 2 * ttl)
  redis.call('pexpire', KEYS[5], 2 * ttl)
end

-- grant records that the lock was given, with token, to the owner's queued
-- call with ticket.
local function grant(owner, token, ticket)
  redis.call('hset', KEYS[5], owner, string.format('g %d %s', token, ticket))
end

-- granted reports whether the owner's call with ticket holds a grant it has
-- not taken yet.
local function granted(owner, ticket)
  local given = string.match(redis.call('hget', KEYS[5], owner) or '', '^g %d+ (%S+)$')
  return given ~= nil and given == ticket
end

-- publish_command is PUBLISH, or SPUBLISH on a Cluster with sharded pub/sub,
-- where the client's scripts have it replaced (see scripts.go).
local publish_command = 'publish'

-- publish sends a message, but a failure (an ACL that denies the channel)
-- does not abort the script: every write before it stays consistent, and
-- the waiter it was for finds out on its next retry.
local function publish(channel, message)
  redis.pcall(publish_command, channel, message)
end

-- notify sends a waiter a notice on its client's notice channel: "<kind>
-- <owner> <name>[ <more>]", where the name is the lock's, KEYS[1]. Kinds: '1',
-- the waiter heads the queue of a free lock and should try at once; '0', it
-- heads the queue of a held lock and should try on the release message; 'g',
-- the lock was handed to it, with the token and lease (ms) that follow. The
-- client ID comes from the waiter's queue entry, or else from the owner ID
-- "<client ID>:<n>".
local function notify(prefix, client, owner, kind, more)
  if not client or client == '' then
    client = string.match(owner, '^(.*):[^:]*$')
  end
  if client then
    local msg = kind .. ' ' .. owner .. ' ' .. KEYS[1]
    if more then
      msg = msg .. ' ' .. more
    end
    publish(prefix .. client, msg)
  end
end

-- free_lock runs once the lock's hash is gone: its last holder released it
-- and the caller deleted what was left. It hands the lock to the live head of
-- the queue, if there is one: the head holds it at once, with a new token and
-- a grant, and is told so. Its lease is what it asked for, but at most
-- claimTTL, so a waiter that died while queued holds up the lock for no longer
-- than that; a live one extends its lease once it has the notice. With nobody
-- queued, the release message is published.
--
-- Redisson clients wait outside the queue, on the release channel, and take
-- the lock only when they find it free; handed over from one lockwarden
-- waiter to the next, it would never be. Every lockwarden client that
-- listens on the release channel also listens on the lock's members channel,
-- "lockwarden_lock__notice:{<name>}" (the notice prefix without a client ID),
-- on which nothing is published: more listeners on the first than on the
-- second are not lockwarden's. Then the turns are kept even. A release that
-- frees the lock, theirs or ours, starts a race between them and the head of
-- the queue; each race the head loses (see acquire.lua) is owed to the
-- queue, under '~owed' in the entries hash, a field no owner ID can be. A
-- lockwarden release hands the lock over while the queue is owed turns, one
-- per release, and otherwise leaves it free and tells the head to race.
-- With classic pub/sub in a Cluster, the listeners counted are those on the
-- lock's own node only; sharded ones are all there.
local function outsiders_wait(prefix)
  local members = string.sub(prefix, 1, -2)
  local counts
  if publish_command == 'spublish' then
    counts = redis.call('pubsub', 'shardnumsub', KEYS[2], members)
  else
    counts = redis.call('pubsub', 'numsub', KEYS[2], members)
  end
  return counts[2] > counts[4]
end

local function free_lock(prefix, claimTTL)
  local queued = redis.call('zcard', KEYS[4])
  if queued == 0 then
    publish(KEYS[2], '0')
    return
  end
  if outsiders_wait(prefix) then
    if tonumber(redis.call('hget', KEYS[5], '~owed') or 0) > 0 then
      redis.call('hincrby', KEYS[5], '~owed', -1)
    else
      publish(KEYS[2], '0')
      local head, _, client = live_head()
      if head then
        notify(prefix, client, head, '1')
      end
      return
    end
  end
  local head, lease, client, ticket = pop_live_head()
  if not head then
    publish(KEYS[2], '0')
    return
  end
  lease = math.min(lease, claimTTL)
  redis.call('hset', KEYS[1], head, 1)
  redis.call('pexpire', KEYS[1], lease)
  local token = next_token()
  grant(head, token, ticket)
  notify(prefix, client, head, 'g', string.format('%d %d %s', token, lease, ticket))
end
