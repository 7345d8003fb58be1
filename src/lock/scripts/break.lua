-- Operator override: delete the lock's holders whoever they are, report whom each slot was taken
-- from, wake the waiters. The fencing counter is left as it is, so a broken holder's token is stale
-- for any fenced store.
-- KEYS: lock (slot 1), holder hash (slot 1's), limit
-- ARGV: release channel, slot key base, holder hash base (slot i >= 2 is `base .. i`), then the
--       tokens the operator confirmed (none: every holder)
-- Returns {{{slot, token, {holder field, value, ...}}, ...} broken, {token, ...} left as they are
--          because the operator did not confirm them (they came after the question)}
local confirmed = {}
local any = #ARGV <= 3
for i = 4, #ARGV do
  confirmed[ARGV[i]] = true
end
local limit = tonumber(redis.call('GET', KEYS[3]) or '')
local broken, left = {}, {}
for i = 1, limit or 1 do
  local key, holder = KEYS[1], KEYS[2]
  if i > 1 then
    key, holder = ARGV[2] .. i, ARGV[3] .. i
  end
  local token = redis.call('GET', key)
  if token and (any or confirmed[token]) then
    broken[#broken + 1] = {i, token, redis.call('HGETALL', holder)}
    redis.call('DEL', key, holder)
  elseif token then
    left[#left + 1] = token
  end
end
if #broken > 0 then
  if limit and #left == 0 then
    local live = false
    for i = 1, limit do
      live = live or redis.call('GET', i == 1 and KEYS[1] or ARGV[2] .. i)
    end
    if not live then
      redis.call('DEL', KEYS[3])
    end
  end
  redis.call('PUBLISH', ARGV[1], 'broken')
end
return {broken, left}
