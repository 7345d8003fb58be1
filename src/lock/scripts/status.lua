-- Everything `status` shows about one lock on one node, read atomically in one round trip.
-- KEYS: lock, fence counter, holder hash
-- Returns {token or false, pttl, fence or false, {holder field, value, ...}, {server seconds, micros},
--          uptime in seconds (left out when INFO has none)}
local up = string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)')
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]),
  redis.call('HGETALL', KEYS[3]), redis.call('TIME'), tonumber(up)}
