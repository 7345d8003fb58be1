-- Operator override: delete the lock whoever holds it, report whom it was taken from, wake the waiters.
-- The fencing counter is left as it is, so the broken holder's token is stale for any fenced store.
-- KEYS: lock, holder hash
-- ARGV: release channel, the token the operator confirmed ('' = whoever holds it)
-- Returns {token or false, {holder field, value, ...}}, or {false, {}, token} when the lock is held by
-- another token than the one confirmed (it changed hands while the operator read the question).
local token = redis.call('GET', KEYS[1])
if token and ARGV[2] ~= '' and token ~= ARGV[2] then
  return {false, {}, token}
end
local holder = redis.call('HGETALL', KEYS[2])
if token then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('PUBLISH', ARGV[1], 'broken')
end
return {token, holder}
