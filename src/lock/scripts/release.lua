-- Compare-and-delete: remove the lock only where it still holds our token, then wake whom the
-- release lets in: the first live waiters of the queue, as many as there are free slots (waiters
-- whose heartbeat expired are dropped first), each on its own channel. The release channel is still
-- announced for older clients.
-- KEYS: lock (slot 1), holder hash (slot 1's), limit, queue, alive, waiters, seen
-- ARGV: token, release channel, slot key base, holder hash base (slot i >= 2 is `base .. i`), wake
--       channel prefix, a waiter's lifetime at the front of the queue in ms (the caller's slack
--       counted)
-- Returns the slots whose key held our token and was deleted (empty: not ours; expired, broken, taken).
-- The token is looked for in every slot of the limit recorded for the name (slot 1 alone without
-- one), so a release needs no slot number. Every key of the token goes: besides its grant's slot it
-- may hold a stray in another (a round-1 request that ran late here), which is the caller's too. The
-- client judges the release by the slot with a quorum. Once no slot is held the limit is forgotten.
local token = ARGV[1]
local n = tonumber(redis.call('GET', KEYS[3]) or '')
local deleted = {}
if redis.call('GET', KEYS[1]) == token then
  redis.call('DEL', KEYS[1], KEYS[2])
  deleted[1] = 1
end
for i = 2, n or 1 do
  if redis.call('GET', ARGV[3] .. i) == token then
    redis.call('DEL', ARGV[3] .. i, ARGV[4] .. i)
    deleted[#deleted + 1] = i
  end
end
if #deleted == 0 then
  return deleted
end
redis.call('PUBLISH', ARGV[2], 'released')
-- free: the number of free slots.
local free = 0
for i = 1, n or 1 do
  if not redis.call('GET', i == 1 and KEYS[1] or ARGV[3] .. i) then
    free = free + 1
  end
end
if n and free == n and redis.call('ZCARD', KEYS[4]) == 0 then
  redis.call('DEL', KEYS[3])
end
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
keep_time(KEYS[4], KEYS[5], KEYS[7], now_ms, tonumber(ARGV[6]), ARGV[5], false)
local dead = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_ms)
if #dead > 0 then
  redis.call('ZREM', KEYS[4], unpack(dead))
  redis.call('ZREM', KEYS[5], unpack(dead))
  redis.call('HDEL', KEYS[6], unpack(dead))
  clamp_front(KEYS[4], KEYS[5], KEYS[6], (n or 1) + 1, now_ms, tonumber(ARGV[6]), ARGV[5])
end
for _, w in ipairs(redis.call('ZRANGE', KEYS[4], 0, free - 1)) do
  redis.call('PUBLISH', ARGV[5] .. '\031' .. w, 'released')
end
return deleted
