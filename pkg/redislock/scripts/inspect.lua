-- inspect: a consistent snapshot of one lock, for status and debugging.
-- KEYS: see lib.lua.
--
-- Returns {pttl, token, {owner, count, ...}, {live waiter, ...}}.
local now = now_ms()
local waiters = {}
for _, id in ipairs(redis.call('zrange', KEYS[4], 0, -1)) do
  local expiry = string.match(redis.call('hget', KEYS[5], id) or '', '^(%d+) ')
  if expiry and tonumber(expiry) > now then
    table.insert(waiters, id)
  end
end
return {
  redis.call('pttl', KEYS[1]),
  tonumber(redis.call('get', KEYS[3]) or 0),
  redis.call('hgetall', KEYS[1]),
  waiters,
}
