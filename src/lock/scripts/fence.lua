-- Round 2 of a Redlock grant: raise this node's fencing counter to at least T, the largest counter of
-- round 1, but only while the lock here still holds our token.
-- KEYS: the slot's key (the lock key for slot 1), fence counter, the slot's holder hash
-- ARGV: token, T (decimal string), '1' for a semaphore (N > 1): the counter must go from below T to T
--       here, by us
-- Returns 1 when the counter is now >= T under our lock, 0 when the lock is no longer ours, 2 when
-- (semaphore) another grant already took the counter to T or beyond: T may be its fence too.
-- A resend after a dropped connection finds T in our holder record, which only our own raise (or
-- our own round-1 increment) writes, and answers 1 again: the counter went to T by us.
-- Counters are compared as decimal strings so that no value above 2^53 is rounded by Lua's numbers.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local current = redis.call('GET', KEYS[2]) or '0'
local t = ARGV[2]
if #current < #t or (#current == #t and current < t) then
  redis.call('SET', KEYS[2], t)
elseif ARGV[3] == '1' and redis.call('HGET', KEYS[3], 'fence') ~= t then
  return 2
end
redis.call('HSET', KEYS[3], 'fence', t)
return 1
