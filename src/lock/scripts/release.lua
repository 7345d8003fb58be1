-- Compare-and-delete: remove the lock only where it still holds our token, then wake the waiters.
-- KEYS: lock (slot 1), holder hash (slot 1's), limit
-- ARGV: token, release channel, slot key base, holder hash base (slot i >= 2 is `base .. i`)
-- Returns 1 when our lock was deleted, 0 when it was not ours (expired, broken, taken by another).
-- The token is looked for in every slot of the limit recorded for the name (slot 1 alone without
-- one), so a release needs no slot number; once no slot is held the limit is forgotten.
local token = ARGV[1]
local key, holder = KEYS[1], KEYS[2]
local n = tonumber(redis.call('GET', KEYS[3]) or '')
if redis.call('GET', key) ~= token then
  key = nil
  for i = 2, n or 1 do
    if redis.call('GET', ARGV[3] .. i) == token then
      key, holder = ARGV[3] .. i, ARGV[4] .. i
      break
    end
  end
  if not key then
    return 0
  end
end
redis.call('DEL', key, holder)
redis.call('PUBLISH', ARGV[2], 'released')
if n then
  local live = redis.call('GET', KEYS[1])
  for i = 2, n do
    live = live or redis.call('GET', ARGV[3] .. i)
  end
  if not live then
    redis.call('DEL', KEYS[3])
  end
end
return 1
