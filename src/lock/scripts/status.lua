-- Everything `status` shows about one lock on one node, read atomically in one round trip.
-- KEYS: lock (slot 1), fence counter, holder hash (slot 1's), limit
-- ARGV: slot key base, holder hash base (slot i >= 2 is `base .. i`)
-- Returns {token or false, pttl, fence or false, {holder field, value, ...}, {server seconds, micros},
--          uptime in seconds or false, the limit or false,
--          {{slot, token, pttl, {holder field, value, ...}}, ...} for the held slots from 2 on}
local up = string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)')
local limit = tonumber(redis.call('GET', KEYS[4]) or '')
local slots = {}
for i = 2, limit or 1 do
  local token = redis.call('GET', ARGV[1] .. i)
  if token then
    slots[#slots + 1] = {i, token, redis.call('PTTL', ARGV[1] .. i),
      redis.call('HGETALL', ARGV[2] .. i)}
  end
end
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]),
  redis.call('HGETALL', KEYS[3]), redis.call('TIME'), tonumber(up) or false, limit or false, slots}
