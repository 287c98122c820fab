-- inspect: a consistent snapshot of one lock, for status and debugging.
-- KEYS: see lib.lua.
--
-- Returns {pttl, token, {field, value, ...}, {live waiter, ...}}: the lock
-- hash's fields include lockwarden's own (see lib.lua), which the client
-- leaves out.
-- @lib
local waiters = {}
for _, id in ipairs(redis.call('zrange', KEYS[4], 0, -1)) do
  local lapse = parse_entry(redis.call('hget', KEYS[5], id))
  if lapse and lapse > now_ms() then
    table.insert(waiters, id)
  end
end
return {
  redis.call('pttl', KEYS[1]),
  tonumber(redis.call('get', KEYS[3]) or '0') or 0,
  redis.call('hgetall', KEYS[1]),
  waiters,
}
