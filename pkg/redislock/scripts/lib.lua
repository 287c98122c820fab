-- Shared helpers, inserted where a script says "@lib", after its fast path,
-- so that a call that takes the fast path defines none of them. Every script
-- but renew.lua and ttl.lua gets the same KEYS:
--
-- KEYS[1] lock hash            <name>
-- KEYS[2] release channel      redisson_lock__channel:{<name>}
-- KEYS[3] fencing counter      redisson_lock_token:{<name>}
-- KEYS[4] wait queue           lockwarden_lock_queue:{<name>}
-- KEYS[5] wait queue entries   lockwarden_lock_queue_entry:{<name>}
-- KEYS[6] finished calls       lockwarden_lock_done:{<name>}
-- KEYS[7] the last freed hash  lockwarden_lock_freed:{<name>}
--
-- The lock hash is Redisson's: the owner ID's field counts its levels, and
-- PEXPIRE is the lease. Lockwarden adds fields no owner ID can be, since
-- they start with '~':
--   ~t         "<token> <terms>": the ownership's fencing token, and its
--              lease terms, the lease in ms with 'w' if a watchdog renews
--              it; a re-entry under other terms is refused
--   ~h<ticket> a Lock call's level: 1 while held, 0 once undone while a
--              late copy of the call's request may still arrive. A call's
--              requests all carry its ticket, so a resend (go-redis sends a
--              command again when its reply was lost) finds its level there
--              and counts none, and an Unlock undoes its own level at most
--              once, however often it is sent. A Lock for an owner of its
--              own uses the owner ID as its ticket, and its level needs no
--              field: it is the owner's while the field is absent, and 0
--              once undone.
--   ~q         set while lockwarden waiters may be queued, so the release
--              that frees the lock hands it over, or once the level of a
--              call with no field of its own was undone: either way an
--              Unlock must go by release.lua, not unlock.lua
--   ~a         how many of the owner's levels were left by a client that
--              closed keeping its locks (Options.KeepOnClose), marked 'a'
--              in their '~h' fields: the release that leaves only those
--              frees the lock, so that the owner's adopter can end it
-- A Redisson owner's hash has none of them, which is how a Redisson holder
-- is told apart (see free_lock).
--
-- The queue (KEYS[4]) is a sorted set of waiting owner IDs, scored by
-- arrival (server clock, microseconds), and KEYS[5] a hash from each to
-- "<lapses at, ms> <lease ms> <queue TTL ms> <client ID> <ticket> <terms>":
-- when the entry lapses unless refreshed (its waiter stopped: a crashed
-- process), the lease and terms the call asked for, the waiter's own queue
-- TTL (which bounds the lease a hand-over grants it), the client whose
-- notice channel reaches it, and the call's ticket. Both keys expire when no
-- waiter has refreshed them for two queue TTLs, and no waiter shortens
-- another's. KEYS[5] also keeps the fair-share state of a lock that Redisson
-- clients also wait for: '~foreign' (when a Redisson holder was last seen,
-- ms), '~owed' (races the queue lost to one), '~probe' (the next time a
-- release may look for outside listeners, and how long it waits after,
-- ms), '~wait' (how long a race leaves the lock to others, ms: see
-- race_grace), and of the last race, '~racing' (the head of the queue
-- then) and '~grace' (until when the head leaves the lock to others, ms).
--
-- KEYS[6] remembers the tickets of calls whose requests may still arrive
-- late, once their levels are undone (see release.lua); a request that
-- finds its ticket there changes nothing. Nothing else is kept apart from
-- the lock hash but KEYS[7]: the release that frees the lock renames the
-- hash there rather than deleting it, with the lease it had left, so a
-- resend of that release, whose reply was lost, finds its own level in the
-- ownership it freed and reports the release (see freed_by). The lock hash
-- is otherwise the only record of a call, so eviction cannot make a resend
-- count twice without the lock itself going; an eviction of KEYS[6] can
-- let a late copy of a finished call's Lock take the lock for nobody, so
-- Redis must run with maxmemory-policy noeviction.

-- The clock, in microseconds: the calling client's, if the script has it
-- (see use_clock), and otherwise the server's, read once per run. Tokens,
-- arrivals in the queue and the times entries lapse at so follow the
-- clients' clocks, which costs no TIME call; a client whose clock is off by
-- more than a QueueTTL would judge other waiters' places lapsed too early
-- or too late.
local clock_us, clock_text
local function use_clock(text)
  clock_us, clock_text = tonumber(text), text
end

local function now_us()
  if not clock_us then
    local t = redis.call('time')
    clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return clock_us
end

local function now_ms()
  return math.floor(now_us() / 1000)
end

-- now_text is now_us as a decimal string.
local function now_text()
  if not clock_text then
    clock_text = string.format('%d', now_us())
  end
  return clock_text
end

-- next_token takes the fencing token of a new ownership: one more than the
-- last, or clock (microseconds, as a decimal string: see now_us) if that is
-- higher. No lock is taken a million times a second, so
-- tokens follow the clocks, and when Redis loses the counter or its last
-- increments (a restart without persistence, a crash with appendfsync
-- everysec, a failover to a lagging replica) the next token still rises
-- above every one handed out before. The counter is Redisson's: its fenced
-- lock INCRs it, and it never expires.
local function next_token(clock)
  local last = redis.call('set', KEYS[3], clock, 'get')
  -- Decimal strings compare as numbers if their lengths do: no conversion.
  if last and (#last > #clock or #last == #clock and last >= clock) and tonumber(last) then
    -- %d: Lua would print a number this large in exponent form.
    local token = string.format('%d', tonumber(last) + 1)
    redis.call('set', KEYS[3], token)
    return token
  end
  return clock
end

-- publish sends a message with PUBLISH, or SPUBLISH on a Cluster with
-- sharded pub/sub (scripts.go substitutes the command). A failure (an ACL
-- that denies the channel) does not abort the script: every write before it
-- stays, and the waiter it was for finds out on its next retry.
local function publish(channel, message)
  redis.pcall('__PUBLISH__', channel, message)
end

-- notify sends a waiter a notice on its client's notice channel, "<kind>
-- <owner> <name>[ <more>]" with the lock's name. Kinds: '1', the waiter
-- heads the queue of a free lock and should try at once, or once the grace
-- (ms) that may follow has passed (see races); '0', it heads the
-- queue of a held lock and should try on the release message; 'g', the lock
-- was handed to it, with the token, lease (ms) and ticket that follow.
local function notify(prefix, client, owner, kind, more)
  local msg = kind .. ' ' .. owner .. ' ' .. KEYS[1]
  if more then
    msg = msg .. ' ' .. more
  end
  publish(prefix .. client, msg)
end

-- parse_entry returns a queue entry's lapse time, lease, queue TTL, client,
-- ticket and terms, or nothing for an entry it cannot read.
local function parse_entry(entry)
  local lapse, lease, ttl, client, ticket, terms =
    string.match(entry or '', '^(%d+) (%d+) (%d+) (%S+) (%S+) (%S+)$')
  if lapse then
    return tonumber(lapse), tonumber(lease), tonumber(ttl), client, ticket, terms
  end
end

-- level tells what became of a call's level in an ownership of owner
-- that holds the lock (see '~h'), from the call's marker: 'live', 'undone',
-- or nil when the call has none.
local function level(marker, owner, ticket)
  if marker == '1' then
    return 'live'
  elseif marker == '0' then
    return 'undone'
  elseif marker == 'a' then
    return 'abandoned'
  elseif not marker and ticket == owner then
    return 'live'
  end
end

-- freed_by reports whether the release with this ticket freed the
-- ownership whose '~t' is t: the hash the freeing release left in KEYS[7]
-- is that ownership's, with the call's level live in it. Only a release
-- frees a lock by renaming it there: a ForceRelease, a lease that ran out or
-- a Redis that lost the hash leave nothing that passes.
local function freed_by(owner, ticket, t)
  local g = redis.call('hmget', KEYS[7], owner, '~t', '~h' .. ticket)
  return g[1] and g[2] == t and level(g[3], owner, ticket) == 'live'
end

-- token_of and terms_of read the two halves of '~t'.
local function token_of(t)
  return tonumber(string.match(t or '', '^(%d+)'))
end

local function terms_of(t)
  return string.match(t or '', ' (%S+)$')
end

-- lease_of is the lease in ms of lease terms.
local function lease_of(terms)
  return string.match(terms, '^(%d+)')
end

-- notice_prefix is the prefix of the lock's notice channels,
-- "lockwarden_lock__notice:{<name>}:", from its release channel.
local function notice_prefix()
  return 'lockwarden_lock__notice:' .. string.sub(KEYS[2], #'redisson_lock__channel:' + 1) .. ':'
end

-- How far back in the queue a waiter looks at the entries ahead of it (see
-- acquire.lua): further back, it waits its turn to come nearer.
local lookahead = 16

local function dequeue(owner)
  redis.call('zrem', KEYS[4], owner)
  redis.call('hdel', KEYS[5], owner)
end

-- live_head drops lapsed entries from the front of the queue and returns the
-- live head, its client and its ticket, or nothing when nobody waits.
local function live_head()
  while true do
    local head = redis.call('zrange', KEYS[4], 0, 0)[1]
    if not head then
      return
    end
    local lapse, _, _, client, ticket = parse_entry(redis.call('hget', KEYS[5], head))
    if lapse and lapse > now_ms() then
      return head, client, ticket
    end
    dequeue(head)
  end
end

-- tell_head sends the live head, if any, a notice: '1' if the lock is free,
-- '0' if it is held.
local function tell_head(prefix)
  local head, client = live_head()
  if head then
    local kind = '0'
    if redis.call('exists', KEYS[1]) == 0 then
      kind = '1'
    end
    notify(prefix, client, head, kind)
  end
end

-- remember records tickets (space-separated) of calls whose requests may
-- still arrive late, for ms milliseconds.
local function remember(tickets, ms)
  local args = {}
  for ticket in string.gmatch(tickets, '%S+') do
    args[#args + 1] = ticket
    args[#args + 1] = 1
  end
  if #args == 0 then
    return
  end
  redis.call('hset', KEYS[6], unpack(args))
  if redis.call('pttl', KEYS[6]) < tonumber(ms) then
    redis.call('pexpire', KEYS[6], ms)
  end
end

-- finished reports whether a call with this ticket is done: its requests
-- change nothing any more.
local function finished(ticket)
  return redis.call('hexists', KEYS[6], ticket) == 1
end

-- How long a Redisson holder, once seen, keeps releases racing (ms); how
-- soon after the first race a release may race again for listeners that
-- are not lockwarden's (ms), and how far apart such races may grow while
-- none finds a Redisson client (ms).
local race_window = 10000
local probe_first = 1000
local probe_most = 30000
-- How long a race release keeps the lock for clients outside the queue
-- (ms): they take it if they wait for it; the head of the queue takes it
-- after that if they do not. It starts at race_grace, and after each race
-- that nobody outside the queue took (see acquire.lua) it doubles, up to
-- race_grace_most, while clients that are not lockwarden's listen on the
-- release channel (or PUBSUB NUMSUB cannot tell), and starts over once
-- nobody does: a loaded machine's Redisson waiters answer a release later
-- than an idle one's, and would otherwise lose every race. It lasts as long
-- as the queue's fair-share state (KEYS[5]).
local race_grace = 10
local race_grace_most = 80

-- outsiders reports whether more clients listen on the release channel than
-- lockwarden's waiters, who also listen on the lock's members channel
-- (the notice prefix without a client ID), on which nothing is published.
-- PUBSUB NUMSUB is optional: without it, the answer is nil.
local function outsiders(prefix)
  local members = string.sub(prefix, 1, -2)
  local counts
  if '__PUBLISH__' == 'spublish' then
    counts = redis.pcall('pubsub', 'shardnumsub', KEYS[2], members)
  else
    counts = redis.pcall('pubsub', 'numsub', KEYS[2], members)
  end
  if type(counts) ~= 'table' or counts.err or counts[2] == nil then
    return nil
  end
  return counts[2] > counts[4]
end

-- races decides whether the release that frees the lock leaves it free for
-- a race between the head of the queue and Redisson's waiters, who wait
-- outside the queue and take the lock only when they find it free: handed
-- from one lockwarden waiter to the next, it would never be. fair is the
-- entries hash's '~foreign', '~owed' and '~probe'.
--
-- Within race_window of the last time a Redisson holder was seen, every
-- release races, but for the turns owed to the queue: each race its head
-- lost to a Redisson client (see acquire.lua) is repaid with one hand-over.
-- The two sides so take turns, about half each, whatever the head count:
-- a Redisson client gets a race, a lockwarden waiter the hand-over after.
-- (Not every Redisson client listens where PUBSUB NUMSUB sees it: one that
-- subscribes on a replica, or polls, would never get a race a listener
-- count decided.) Outside that window a release hands the lock over, but
-- now and then it races if clients that are not lockwarden's listen on the
-- release channel: Redisson waiters, who show themselves by winning, or
-- plain listeners (the controller, a monitor), who cost that one race. The
-- first such race comes with the first release that finds a queue, the next
-- probe_first later, and each one that no Redisson client wins doubles the
-- wait for the next, up to probe_most; a Redisson holder seen starts it
-- over (see acquire.lua).
local function races(prefix, fair)
  local now = now_ms()
  if now - (tonumber(fair[1]) or 0) < race_window then
    if (tonumber(fair[2]) or 0) > 0 then
      redis.call('hincrby', KEYS[5], '~owed', -1)
      return false
    end
    return true
  end
  local due, gap = string.match(fair[3] or '', '^(%d+) (%d+)$')
  if not due then
    due, gap = now, probe_first / 2
  end
  if now < tonumber(due) then
    return false
  end
  gap = tonumber(gap)
  local race = outsiders(prefix)
  if race then
    gap = math.min(2 * gap, probe_most)
  end
  redis.call('hset', KEYS[5], '~probe', string.format('%d %d', now + gap, gap))
  return race
end

-- free_lock runs once the lock's hash is gone: its last level was undone.
-- With waiters queued, it hands the lock to the live head: the head holds it
-- at once, with a new token, a level for its call and the lease it asked
-- for, but at most its own queue TTL, so a waiter that died while queued
-- holds up the lock no longer than that; a live one extends it once it has
-- the notice. Otherwise, or when the release races, the release message "0"
-- is published, as Redisson's unlock does.
local function free_lock(prefix)
  while true do
    local popped = redis.call('zpopmin', KEYS[4])
    local head, arrived = popped[1], popped[2]
    if not head then
      break
    end
    local e = redis.call('hmget', KEYS[5], head, '~foreign', '~owed', '~probe', '~wait')
    local lapse, lease, ttl, client, ticket, terms = parse_entry(e[1])
    if lapse and lapse > now_ms() then
      if races(prefix, {e[2], e[3], e[4]}) then
        -- The head waits before it takes the lock (see race_grace), so
        -- clients outside the queue that wait for it get it; if one does,
        -- the head finds it held, and the queue is owed a turn (see
        -- acquire.lua). Its place goes back with the queue's expiry: the
        -- pop may have deleted the queue, and with it the expiry.
        local wait = tonumber(e[5] or '') or race_grace
        redis.call('zadd', KEYS[4], arrived, head)
        if redis.call('pttl', KEYS[4]) < 0 then
          redis.call('pexpire', KEYS[4], 2 * ttl)
        end
        redis.call('hset', KEYS[5], '~racing', head, '~grace', now_ms() + wait)
        notify(prefix, client, head, '1', wait)
        publish(KEYS[2], '0')
        return
      end
      redis.call('hdel', KEYS[5], head)
      local token = next_token(now_text())
      local grant = math.min(lease, ttl)
      if ticket == head then
        redis.call('hset', KEYS[1], head, '1', '~t', token .. ' ' .. terms, '~q', '1')
      else
        redis.call('hset', KEYS[1], head, '1', '~t', token .. ' ' .. terms, '~h' .. ticket, '1', '~q', '1')
      end
      redis.call('pexpire', KEYS[1], grant)
      notify(prefix, client, head, 'g', token .. ' ' .. grant .. ' ' .. ticket)
      return
    end
    redis.call('hdel', KEYS[5], head)
  end
  publish(KEYS[2], '0')
end

-- undo_level undoes the level a call holds (its marker is set) and reports
-- the owner's remaining count; remembered is the tickets to record as
-- finished if that frees the lock, and the call keeps its marker at 0 if
-- its ticket is among them. abandoned is how many of the owner's levels a
-- closed client left (see '~a'): when only those would remain, the lock is
-- freed. The freed hash is kept in KEYS[7] (see freed_by).
local function undo_level(owner, ticket, count, abandoned, queued, prefix, remembered, ms)
  if count - abandoned > 1 then
    redis.call('hincrby', KEYS[1], owner, -1)
    if ticket == owner then
      redis.call('hset', KEYS[1], '~h' .. ticket, '0', '~q', '1')
    elseif string.find(' ' .. remembered .. ' ', ' ' .. ticket .. ' ', 1, true) then
      redis.call('hset', KEYS[1], '~h' .. ticket, '0')
    else
      redis.call('hdel', KEYS[1], '~h' .. ticket)
    end
    return count - 1
  end
  redis.call('rename', KEYS[1], KEYS[7])
  remember(remembered, ms)
  if queued then
    free_lock(prefix)
  else
    publish(KEYS[2], '0')
  end
  return 0
end
