-- inspect: a consistent snapshot of one lock, for status and debugging.
--
-- KEYS[1] lock hash           <name>
-- KEYS[2] fencing counter     redisson_lock_token:{<name>}
-- KEYS[3] wait queue          lockwarden_lock_queue:{<name>}
-- KEYS[4] wait queue expiry   lockwarden_lock_queue_expiry:{<name>}
--
-- Returns {pttl, token, {owner, count, ...}, {live waiter, ...}}.
local now = now_ms()
local waiters = {}
for _, id in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
  local expiry = tonumber(redis.call('zscore', KEYS[4], id))
  if expiry and expiry > now then
    table.insert(waiters, id)
  end
end
return {
  redis.call('pttl', KEYS[1]),
  tonumber(redis.call('get', KEYS[2]) or 0),
  redis.call('hgetall', KEYS[1]),
  waiters,
}
