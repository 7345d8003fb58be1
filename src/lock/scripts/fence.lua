-- Round 2 of a Redlock grant: raise this node's fencing counter to at least T, the largest counter of
-- round 1, but only while the lock here still holds our token.
-- KEYS: lock, fence counter, holder hash
-- ARGV: token, T (decimal string)
-- Returns 1 when the counter is now >= T under our lock, 0 when the lock is no longer ours.
-- Counters are compared as decimal strings so that no value above 2^53 is rounded by Lua's numbers.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local current = redis.call('GET', KEYS[2]) or '0'
local t = ARGV[2]
if #current < #t or (#current == #t and current < t) then
  redis.call('SET', KEYS[2], t)
end
redis.call('HSET', KEYS[3], 'fence', t)
return 1
