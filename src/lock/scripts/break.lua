-- Operator override: delete the lock's holders whoever they are, report whom each slot was taken
-- from, wake the waiters that the freed slots let in (on their own channels; the release channel is
-- still announced for older clients). Waiters stay queued. The fencing counter is left as it is, so
-- a broken holder's token is stale for any fenced store.
-- KEYS: lock (slot 1), holder hash (slot 1's), limit, queue, alive, waiters, seen, and (optional)
--       the record of this break call (its name carries the call's own random id)
-- ARGV: release channel, slot key base, holder hash base (slot i >= 2 is `base .. i`), wake channel
--       prefix, a waiter's lifetime at the front of the queue in ms (the caller's slack counted),
--       the record's lifetime in ms ('' without a record), then the tokens the operator confirmed
--       (none: every holder)
-- Returns {{{slot, token, {holder field, value, ...}}, ...} broken, {token, ...} left as they are
--          because the operator did not confirm them (they came after the question)}
-- The record: the client sends a break again when the connection drops before the reply (node.rs).
-- Run again, an unconfirmed break would take the lock from whoever the first send let in (a waiter
-- it woke), whom nobody asked to break, and report that holder instead of the one broken. So a send
-- that ran keeps its answer under the call's id for a little longer than the call can last, and a
-- send of the same call that finds it returns it and changes nothing. A first send never finds one.
if KEYS[8] then
  local done = redis.call('GET', KEYS[8])
  if done then
    return cjson.decode(done)
  end
end
local confirmed = {}
local any = #ARGV <= 6
for i = 7, #ARGV do
  confirmed[ARGV[i]] = true
end
-- The probe of the channel rights comes before the first write; every other PUBLISH is a pcall
-- (release.lua).
if not redis.acl_check_cmd then
  redis.call('PUBLISH', ARGV[4] .. '\031', 'probe')
elseif not redis.acl_check_cmd('PUBLISH', ARGV[4] .. '\031', 'probe') then
  error({err = 'NOPERM no permissions to access one of the channels, or to run PUBLISH'})
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
  redis.pcall('PUBLISH', ARGV[1], 'broken')
  -- free: the number of free slots.
  local free = 0
  for i = 1, limit or 1 do
    if not redis.call('GET', i == 1 and KEYS[1] or ARGV[2] .. i) then
      free = free + 1
    end
  end
  local t = redis.call('TIME')
  local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
  keep_time(KEYS[4], KEYS[5], KEYS[6], KEYS[7], now_ms, tonumber(ARGV[5]), ARGV[4])
  local dead = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_ms)
  if #dead > 0 then
    redis.call('ZREM', KEYS[4], unpack(dead))
    redis.call('ZREM', KEYS[5], unpack(dead))
    redis.call('HDEL', KEYS[6], unpack(dead))
    if redis.call('ZCARD', KEYS[4]) == 0 then
      -- Nobody waits any more: `seen` goes now, not at the end of the keys' floor (acquire.lua).
      redis.call('DEL', KEYS[7])
    end
    clamp_front(KEYS[4], KEYS[5], KEYS[6], (limit or 1) + 1, now_ms, tonumber(ARGV[5]), ARGV[4])
  end
  -- Once no slot is held and nobody waits (the dead dropped above included), the limit is forgotten.
  if limit and free == limit and redis.call('ZCARD', KEYS[4]) == 0 then
    redis.call('DEL', KEYS[3])
  end
  for _, w in ipairs(redis.call('ZRANGE', KEYS[4], 0, free - 1)) do
    redis.pcall('PUBLISH', ARGV[4] .. '\031' .. w, 'broken')
  end
end
if KEYS[8] and tonumber(ARGV[6]) then
  redis.call('SET', KEYS[8], cjson.encode({broken, left}), 'PX', ARGV[6])
end
return {broken, left}
