-- leave: take a waiter that gave up out of the wait queue, and hand the head
-- position on if it had it.
--
-- KEYS[1] lock hash           <name>
-- KEYS[2] wait queue          lockwarden_lock_queue:{<name>}
-- KEYS[3] wait queue expiry   lockwarden_lock_queue_expiry:{<name>}
-- ARGV[1] owner ID
-- ARGV[2] notice channel prefix
-- ARGV[3] lock name
--
-- Returns 1 when the owner was queued, 0 otherwise.
local now = now_ms()
local head = live_head(KEYS[2], KEYS[3], now)
if not redis.call('zscore', KEYS[2], ARGV[1]) then
  return 0
end
dequeue(KEYS[2], KEYS[3], ARGV[1])
if head == ARGV[1] then
  local next = live_head(KEYS[2], KEYS[3], now)
  if next then
    local free = '0'
    if redis.call('exists', KEYS[1]) == 0 then
      free = '1'
    end
    notify_head(ARGV[2], next, free, ARGV[3])
  end
end
return 1
