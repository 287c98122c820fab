-- take: the uncontended Lock of an owner of its own, in as few steps as
-- Redis takes: acquire.lua's fast path, alone, with only the keys and
-- arguments it needs (each costs Redis as much as a small command).
--
-- KEYS[1] lock hash            <name>
-- KEYS[2] fencing counter      redisson_lock_token:{<name>}
-- KEYS[3] wait queue           lockwarden_lock_queue:{<name>}
-- KEYS[4] finished calls       lockwarden_lock_done:{<name>}
-- ARGV[1] owner ID, which is also the call's ticket (see '~h' in lib.lua)
-- ARGV[2] the calling client's clock, microseconds (see next_token)
-- ARGV[3] lease terms (see '~t' in lib.lua)
--
-- Returns the new ownership's token, as a string (Redis need not convert
-- it), or 0 when the lock is held, queued for, or finished calls are
-- remembered: nothing is changed then, and the client sends acquire.lua. Run twice, the second run finds the lock held
-- and answers 0; acquire.lua then finds the call's level there.
if redis.call('exists', KEYS[1], KEYS[3], KEYS[4]) ~= 0 then
  return 0
end
local token = ARGV[2]
local last = redis.call('set', KEYS[2], token, 'get')
-- Decimal strings compare as numbers if their lengths do: no conversion.
if last and (#last > #token or #last == #token and last >= token) and tonumber(last) then
  -- %d: Lua would print a number this large in exponent form.
  token = string.format('%d', tonumber(last) + 1)
  redis.call('set', KEYS[2], token)
end
redis.call('hset', KEYS[1], ARGV[1], '1', '~t', token .. ' ' .. ARGV[3])
redis.call('pexpire', KEYS[1], string.match(ARGV[3], '^%d+'))
return token
